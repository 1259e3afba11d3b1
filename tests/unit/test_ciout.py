"""CI outputs of compare: markdown, JUnit XML, github-action-benchmark JSON, pytest-benchmark export."""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from bench.gate.ciout import benchmark_json, junit, markdown, pytest_benchmark_json, write_outputs
from tests.regress_helpers import frames_compare, make_run, write_run


@pytest.fixture(scope="module")
def table():
    base = make_run({"ddp": 1.0, "single": 1.0, "fsdp": 1.0, "x|<b>": 1.0})
    cur = make_run({"ddp": 1.2, "single": 1.0, "fsdp": 1.0, "x|<b>": 1.0}, statuses={"fsdp": "failed"}, seed=1)
    return frames_compare(base[0], cur[0], 0.05, base_steps=base[1], cur_steps=cur[1])


def test_markdown(table):
    md = markdown(table, 0.05)
    assert md.startswith("### parbench compare: :x: 2 failing cell(s)")
    lines = md.splitlines()
    ddp = next(ln for ln in lines if "/ddp/" in ln)
    assert "regression" in ddp and "+20" in ddp and lines.index(ddp) < md.splitlines().index("<details><summary>"
                                                                                            "2 other cell(s)</summary>")
    assert "x\\|&lt;b&gt;" in md and "<b>" not in md  # a cell name cannot break the table or inject HTML
    ok = markdown(table[table["strategy"] == "single"], 0.05)
    assert ":white_check_mark: no regression" in ok


def test_junit(table):
    root = ET.fromstring(junit(table, 0.05))
    assert root.get("tests") == "4" and root.get("failures") == "2"
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["w/ddp/gloo/cpu/ws2"].find("failure").get("type") == "regression"
    assert cases["w/fsdp/gloo/cpu/ws2"].find("failure").get("type") == "broken"
    assert cases["w/single/gloo/cpu/ws2"].find("failure") is None


def test_benchmark_json(table, tmp_path):
    entries = benchmark_json(table)
    assert {e["name"] for e in entries} == {"w/ddp/gloo/cpu/ws2", "w/single/gloo/cpu/ws2", "w/x|<b>/gloo/cpu/ws2"}
    e = next(e for e in entries if e["name"] == "w/ddp/gloo/cpu/ws2")
    assert set(e) == {"name", "unit", "value", "range", "extra"} and e["value"] == pytest.approx(1200, rel=0.02)
    assert e["range"].startswith("± ") and "regression" in e["extra"]
    write_outputs(table, 0.05, markdown_file=str(tmp_path / "s.md"), junit_file=str(tmp_path / "j.xml"),
                  json_file=str(tmp_path / "b.json"))
    assert json.loads((tmp_path / "b.json").read_text()) == entries
    assert (tmp_path / "s.md").read_text().startswith("### ")


def test_pytest_benchmark_export_reads_back(tmp_path):
    run = write_run(tmp_path / "run", {"ddp": 0.01, "single": 0.02}, statuses={"single": "failed"})
    doc = pytest_benchmark_json(run)
    assert [b["name"] for b in doc["benchmarks"]] == ["parbench[w/ddp/gloo/cpu/ws2]"]
    assert doc["benchmarks"][0]["stats"]["rounds"] == 30
    assert doc["benchmarks"][0]["stats"]["median"] == pytest.approx(0.01, rel=0.02)
    f = tmp_path / "0001_run.json"
    f.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(f)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "parbench[w/ddp/gloo/cpu/ws2]" in out.stdout


def parbench(argv):
    """The CLI as bench/cli/main.py wires it: register(sub), then args.func; UserError -> 2."""
    import argparse

    from bench.cli.gate import register
    from bench.core.errors import UserError

    parser = argparse.ArgumentParser(prog="parbench")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError:
        return 2


def test_cli(tmp_path, capsys):
    a = write_run(tmp_path / "a", {"ddp": 1.0, "single[red]": 1.0})
    b = write_run(tmp_path / "b", {"ddp": 1.0, "single[red]": 1.0}, seed=1)
    slow = write_run(tmp_path / "slow", {"ddp": 1.3, "single[red]": 1.0}, seed=2)
    other = write_run(tmp_path / "other", {"fsdp": 1.0})
    assert parbench(["compare", str(a), str(b)]) == 0
    assert "single[red]" in capsys.readouterr().out  # printed as text, not eaten as rich markup
    md, xml, js = tmp_path / "s.md", tmp_path / "j.xml", tmp_path / "b.json"
    # one run a side: at most noisy by default; --single-run lets the steps decide
    assert parbench(["compare", str(a), str(slow)]) == 0
    assert parbench(["compare", str(a), str(slow), "--single-run", "--markdown", str(md), "--junit", str(xml),
                     "--json", str(js)]) == 1
    assert md.is_file() and xml.is_file() and json.loads(js.read_text())
    assert parbench(["compare", str(a), str(other)]) == 2
    assert parbench(["compare", str(a)]) == 2
    store = str(tmp_path / "h")
    assert parbench(["history", "add", str(a), "--store", store]) == 0
    assert parbench(["history", "add", str(b), "--store", store, "--commit", "c1"]) == 0
    assert parbench(["history", "show", "--store", store, "--plots", str(tmp_path / "png")]) == 0
    assert parbench(["compare", "--history", store, str(slow), "--single-run"]) == 1
    assert parbench(["compare", "--history", store, str(slow), "--machine", "nope"]) == 2
    out = tmp_path / "pb" / "0001_a.json"
    assert parbench(["export", str(a), "--format", "pytest-benchmark", "-o", str(out)]) == 0
    assert len(json.loads(out.read_text())["benchmarks"]) == 2
