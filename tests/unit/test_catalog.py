"""Strategy declarations are readable without torch, and each built-in class carries exactly its own."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from strategies.catalog import DECLARED, Declaration

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, Block())
"""


def test_every_built_in_class_takes_its_declaration_from_the_catalog():
    import strategies

    assert list(strategies.REGISTRY) == list(DECLARED)
    for name, cls in strategies.REGISTRY.items():
        for f in dataclasses.fields(Declaration):
            assert getattr(cls, f.name) == getattr(DECLARED[name], f.name), (name, f.name)
        assert cls.columns() == DECLARED[name].columns()


def test_the_decision_layer_finds_one_default_per_case_and_the_reference():
    assert [d.name for d in DECLARED.values() if d.default_for == "fits"] == ["ddp"]
    assert [d.name for d in DECLARED.values() if d.default_for == "sharded"] == ["fsdp"]
    assert [d.name for d in DECLARED.values() if d.role == "reference"] == ["single"]
    for d in DECLARED.values():
        assert not d.overlap_option or d.overlap_option in {o.name for o in d.options}, d.name
        assert not d.param_dtype_column or d.param_dtype_column in {m.name for m in d.labels}, d.name


READ_A_RUN = BLOCK_TORCH + """
import contextlib, io, pathlib, shutil, tempfile
from bench.cli.main import main
from bench.cli.run import after_run
from bench.results.run import load_run
import strategies.catalog
src, tmp = sys.argv[1], pathlib.Path(tempfile.mkdtemp())
run = tmp / "run"
shutil.copytree(src, run)
load_run(run)
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    codes = [after_run(run, report=True),
             main(["report", str(run)]),
             main(["compare", str(run), str(run), "--json", str(tmp / "c.json")]),
             main(["export", str(run), "--format", "pytest-benchmark", "-o", str(tmp / "b.json")])]
print(*codes, "torch" in sys.modules)
"""


@pytest.mark.long  # a fresh interpreter reading a run folder: 10 s on 2 cores
def test_reading_a_run_folder_imports_no_torch():
    """The summary, the recommendation, the report, compare and export read a run folder with torch
    unimportable: opening results is a pandas job, on any machine."""
    fixture = os.path.join(os.path.dirname(__file__), "..", "fixtures", "runs", "check-h100-x4")
    out = subprocess.run([sys.executable, "-c", READ_A_RUN, fixture], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["0", "0", "0", "0", "False"], (out.stdout[-800:], out.stderr[-2000:])


def test_the_workload_catalog_says_what_each_built_in_workload_is():
    from bench import workloads
    from bench.workloads import catalog, hf

    assert list(catalog.BUILTIN) == workloads.names()
    for name, description in catalog.BUILTIN.items():
        assert workloads.resolve(name).description == description, name
    assert catalog.HF_FAMILIES == tuple(hf.FAMILIES)
