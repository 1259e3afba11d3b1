"""The judge itself: each outcome is reachable, and a real command's right behaviour is ok."""

from __future__ import annotations

import signal

import pytest

from tests.faults.harness import Case, Result, judge, run_case

BAD = Case("x", "demo", [], expect="names the value")


@pytest.mark.parametrize("res,outcome", [
    (Result(2, "", "parbench: error: names the value; fix it\n"), "ok"),
    (Result(None, "", "", hung=True), "hang"),
    (Result(1, "", "Traceback (most recent call last):\n  boom\n"), "traceback"),
    (Result(1, "", "", escaped="Traceback ...ValueError"), "traceback"),
    (Result(2, "", "parbench: error: names the value\n", survivors=["12: torchrun"]), "orphan"),
    (Result(2, "", "parbench: error: names the value\n", lost=["cells row 3"]), "lost"),
    (Result(0, "done\n", ""), "silent"),
    (Result(1, "", ""), "silent"),
    (Result(1, "", "parbench: error: names the value\n"), "unclear"),
    (Result(2, "", "warning: x\nparbench: error: names the value\n"), "unclear"),
    (Result(2, "", "parbench: error: something else\n"), "unclear"),
])
def test_each_outcome(res, outcome, tmp_path):
    assert judge(BAD, res, tmp_path)[0] == outcome


def test_sigkill_is_judged_by_what_is_left(tmp_path):
    case = Case("k", "demo", [], signal=(signal.SIGKILL, 0.0))
    assert judge(case, Result(-9, "", ""), tmp_path)[0] == "ok"
    assert judge(case, Result(-9, "", "", survivors=["1: x"]), tmp_path)[0] == "orphan"


def test_a_real_command_in_process_and_in_a_process(tmp_path):
    for sub in (False, True):
        case = Case(f"missing-{sub}", "report", ["report", "{tmp}/nope"], expect="{tmp}/nope", subprocess=sub)
        res = run_case(case, tmp_path / str(sub))
        assert judge(case, res, tmp_path / str(sub)) == ("ok", ""), (res.code, res.err)
