"""tools/doc_commands.py reads the commands of a markdown page and their `ci:` markers. Nothing here
runs a documented command: .ci/run does that."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import doc_commands as dc

ROOT = Path(__file__).resolve().parents[2]

PAGE = """\
# Title

Some text with `inline code`.

<!-- ci: nox -s bench => nox -s bench -- --device cpu --steps 3 -->
<!-- ci: nox -s tests => skip (CI runs it first) -->
```bash
python3 -m pip install nox && nox -s bench     # the default benchmark
nox -s tests     # the tests
```

```text
results/<run-id>/   not a command
```

```bash
# a comment line
source .nox/bench/bin/activate
parbench run --workloads gpt-200m \\
  --world-sizes 1,2,4   # ci: parbench run --device cpu --world-sizes 2
parbench run --nnodes 2 --rdzv-endpoint node-a:29400   # ci: skip (needs a second node)
parbench report results/<run-id>
parbench compare results/<base> results/<run-id>   # exit 1 on a regression
echo 'a # inside quotes' "and # here"
```
"""


def test_parse_reads_every_bash_command_with_its_markers():
    cmds = dc.parse(PAGE, "page.md")
    got = [(c.line, c.run, c.why) for c in cmds]
    assert got == [
        (8, "python3 -m pip install nox && nox -s bench -- --device cpu --steps 3", ""),
        (9, None, "CI runs it first"),
        (18, "source .nox/bench/bin/activate", ""),
        (19, "parbench run --device cpu --world-sizes 2", ""),
        (21, None, "needs a second node"),
        (22, "parbench report results/<run-id>", ""),
        (23, "parbench compare results/<base> results/<run-id>", ""),
        (24, "echo 'a # inside quotes' \"and # here\"", ""),
    ]
    assert cmds[1].text == "nox -s tests" and cmds[3].text == "parbench run --workloads gpt-200m --world-sizes 1,2,4"
    assert cmds[0].where == "page.md:8"


@pytest.mark.parametrize("page, message", [
    ("```bash\nparbench run   # ci: skip\n```\n", "a skip names why"),
    ("<!-- ci: nox -s lint => skip (x) -->\n```bash\nnox -s bench\n```\n", "matches no command"),
    ("<!-- ci: a => b -->\n```text\na\n```\n", "before a text block"),
    ("<!-- ci: a => b -->\n", "no bash block after it"),
    ("<!-- ci: nox => skip -->\n```bash\nnox -s bench\n```\n", "a skip names why"),
])
def test_a_marker_that_cannot_be_followed_is_an_error(page, message):
    with pytest.raises(dc.MarkerError, match=message):
        dc.parse(page, "p.md")


def test_placeholders_take_the_run_folders_the_commands_made():
    made = ["20260101-000000-aaaa", "20260101-000100-bbbb"]
    cmd = "parbench compare results/<base> results/<run-id>"
    assert dc.resolve(cmd, made, "p.md:1") == f"parbench compare results/{made[0]} results/{made[1]}"
    with pytest.raises(dc.MarkerError, match="needs two run folders"):
        dc.resolve(cmd, made[:1], "p.md:1")
    with pytest.raises(dc.MarkerError, match="placeholder <workload>"):
        dc.resolve("parbench run --workloads <workload>", made, "p.md:1")


def test_comments_end_at_an_unquoted_hash_after_a_blank():
    assert dc.split_comment("a 'b # c' d  # e") == ("a 'b # c' d", "# e")
    assert dc.split_comment("x=a#b") == ("x=a#b", "")
    assert dc.split_comment('echo "\\"#" # ci: skip (y)') == ('echo "\\"#"', "# ci: skip (y)")


@pytest.mark.parametrize("name", dc.DOCS)
def test_the_documented_commands_parse(name):
    path = ROOT / name
    if not path.exists():
        pytest.skip(f"{name} is not in this checkout")
    cmds = dc.parse(path.read_text(encoding="utf-8"), name)
    assert cmds, f"{name} shows no bash command"
    for c in cmds:
        assert c.run is not None or c.why, c.where
        if c.run is not None:
            left = {m.group(1) for m in dc.PLACEHOLDER.finditer(c.run)} - {"run-id", "base"}
            assert not left, f"{c.where}: placeholder(s) {left} need a '# ci:' marker"


def test_ci_runs_the_documented_commands():
    assert "python3 -m tools.doc_commands" in (ROOT / ".ci" / "run").read_text()


def test_a_page_runs_in_one_shell_and_the_next_page_starts_afresh(tmp_path, capsys):
    page_a = dc.parse("```bash\nexport DOC_X=1\ncd sub\nmkdir -p results/20260101-000000-abcd\n"
                      "test \"$DOC_X\" = 1 && test -d results/<run-id>\n```\n", "a.md")
    page_b = dc.parse("```bash\ntest -z \"$DOC_X\" && test ! -d sub/sub\ntest -d results/<run-id>\n```\n", "b.md")
    (tmp_path / "sub").mkdir()
    assert dc.run_all(page_a + page_b, tmp_path, timeout=60) == 1
    out = capsys.readouterr().out
    assert "rc 0" in out and "a.md:5" in out and "b.md:2" in out
    assert "error       b.md:3: <run-id> needs a run folder" in out
    assert "5 ran, 0 skipped, 1 failed" in out
