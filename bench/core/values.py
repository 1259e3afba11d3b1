"""Settings as typed values: comma lists, integers, numbers, integer lists and durations, each
refused in one line that names the value and an example of a good one."""

from __future__ import annotations

import math
import re
from typing import Any

from bench.core.errors import UserError


def split_list(text: str) -> list[str]:
    """Split a comma list, keeping commas inside [...] (workload dimensions) together."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


#: the largest entry of an integer list setting (world sizes): more ranks than any machine or job runs
INT_LIST_MAX = 65_536


def int_list(values: Any, what: str, example: str = "--world-sizes 1,2") -> list[int]:
    """A list of integers >= 1 from a list or a comma list ("1,2"); a one-line UserError naming the
    value and ``example`` otherwise (a bare number, 2.7, True and "two" are refused)."""
    if isinstance(values, str):
        items: list[Any] = split_list(values)
    elif isinstance(values, list | tuple):
        items = list(values)
    else:
        raise UserError(f"{what}: {values!r} must be a list of integers; e.g. {example}")
    out = []
    for v in items:
        if isinstance(v, bool) or isinstance(v, float) or not isinstance(v, int | str):
            raise UserError(f"{what}: {v!r} is not an integer; e.g. {example}")
        try:
            n = int(v)
        except ValueError:
            raise UserError(f"{what}: {v!r} is not an integer; e.g. {example}") from None
        if n < 1:
            raise UserError(f"{what}: {n} must be >= 1; e.g. {example}")
        if n > INT_LIST_MAX:
            raise UserError(f"{what}: {n} is more than {INT_LIST_MAX:,} (a typo?); e.g. {example}")
        out.append(n)
    return out


def as_int(name: str, v: Any, example: str) -> int:
    """An integer setting: ints and integral strings only (True, 2.7 and "five" are refused)."""
    if isinstance(v, bool) or isinstance(v, float) or not isinstance(v, int | str):
        raise UserError(f"{name}={v!r} must be an integer; e.g. {example}")
    try:
        return int(v)
    except ValueError:
        raise UserError(f"{name}={v!r} must be an integer; e.g. {example}") from None


def as_float(name: str, v: Any, example: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise UserError(f"{name}={v!r} must be a number; e.g. {example}")
    try:
        x = float(v)
    except ValueError:
        raise UserError(f"{name}={v!r} must be a number; e.g. {example}") from None
    if not math.isfinite(x):
        what = f"{example.split()[0]} {v}" if example.startswith("--") else f"{name}={v!r}"
        raise UserError(f"{what} must be a finite number; e.g. {example}")
    return x


def parse_duration(text: Any) -> float:
    """'10m', '90s', '1h', '600' (seconds) -> seconds; a one-line UserError otherwise."""
    t = str(text).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*(s|m|min|h)?", t)
    if not m:
        raise UserError(f"budget {text!r} is not a duration; e.g. --budget 10m, 90s or 1h")
    value = float(m[1]) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m[2]]
    if value <= 0 or not math.isfinite(value):
        raise UserError(f"budget {text!r} must be longer than 0 s and finite")
    return value
