"""What a reader accepts from a folder it did not write (a CI artifact, a colleague's run, a history
store): column values typed by parbench's schema, never by the file, and bounds on the size and
nesting of what is read. Each refusal is one UserError naming the file, the value and the limit;
docs/guides/trust.md says the same for users.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.core.errors import UserError

#: meta.json and other JSON a reader loads: larger files are refused before they are read
JSON_MAX_BYTES = 8 * 2**20
#: containers inside containers; parbench's own meta.json is about 4 deep
JSON_MAX_DEPTH = 32
#: part files one table may have (a run appends one per cell and table)
MAX_PARTS = 100_000
#: rows one table may have, from the parquet footers before anything is decoded (a few bytes of
#: parquet can declare billions of rows); PARBENCH_MAX_ROWS raises it for a really large run
MAX_ROWS = 50_000_000
#: decoded bytes one table may declare (50 million rows of parbench's steps are about 4 GiB)
MAX_DECODED_BYTES = 16 * 2**30
#: text a missing number may be written as by another tool
_MISSING = frozenset({"", "nan", "none", "null", "na", "<na>", "n/a"})
_TRUE, _FALSE = frozenset({"true", "1", "yes"}), frozenset({"false", "0", "no"})


def max_rows() -> int:
    """MAX_ROWS, or PARBENCH_MAX_ROWS when that is set to a positive integer."""
    text = os.environ.get("PARBENCH_MAX_ROWS", "")
    return int(text) if text.isdigit() and int(text) > 0 else MAX_ROWS


def read_json(path: Path, fix: str) -> Any:
    """The JSON document in ``path``, refused in one line when it is larger than JSON_MAX_BYTES,
    nested deeper than JSON_MAX_DEPTH or not JSON; ``fix`` ends each message."""
    size = path.stat().st_size
    if size > JSON_MAX_BYTES:
        raise UserError(f"{path} is {size / 2**20:.0f} MiB, over the {JSON_MAX_BYTES // 2**20} MiB a parbench "
                        f"reader accepts; {fix}")
    try:
        doc = json.loads(path.read_bytes())
    except RecursionError:
        doc = None
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not valid JSON ({' '.join(str(e).split())[:120]}); {fix}") from None
    if doc is None or depth(doc) > JSON_MAX_DEPTH:
        raise UserError(f"{path} is nested more than {JSON_MAX_DEPTH} levels deep; {fix}")
    return doc


def depth(doc: Any) -> int:
    """How many containers deep ``doc`` is (a scalar is 0), without recursion; stops counting past
    JSON_MAX_DEPTH."""
    deepest, todo = 0, [(doc, 1)]
    while todo:
        obj, level = todo.pop()
        kids = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else None
        if kids is None:
            continue
        deepest = max(deepest, level)
        if level > JSON_MAX_DEPTH:
            return level
        todo.extend((k, level + 1) for k in kids)
    return deepest


def check_meta_fields(meta: dict[str, Any], path: Path, fields: dict[str, tuple[type, ...]]) -> None:
    """Each field of ``fields`` present in ``meta`` is null or of its types; one line naming the
    first that is not."""
    for key, types in fields.items():
        v = meta.get(key)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool) and bool not in types):
            want = " or ".join({"str": "text", "int": "an integer", "float": "a number", "list": "a list",
                                "dict": "an object"}[t.__name__] for t in types)
            raise UserError(f"{path}: {key!r} is {_show(v)}, not {want}; correct or delete that field")


def check_table(path: Path, files: list[Path], footers: Callable[[], list[tuple[int, int]]]) -> None:
    """A table of ``files`` is within MAX_PARTS parts, max_rows() rows and MAX_DECODED_BYTES, as
    its footers declare them (``footers``: (rows, decoded bytes) per part, read only when the part
    count is within bounds)."""
    if len(files) > MAX_PARTS:
        raise UserError(f"{path} has {len(files)} part files, over the {MAX_PARTS} a parbench reader accepts; "
                        "is it a run folder?")
    sizes = footers()
    rows, size, limit = sum(r for r, _ in sizes), sum(b for _, b in sizes), max_rows()
    if rows > limit:
        raise UserError(f"{path} declares {rows} rows, over the {limit} a parbench reader accepts; set "
                        "PARBENCH_MAX_ROWS to read a larger run")
    if size > MAX_DECODED_BYTES:
        raise UserError(f"{path} declares {size / 2**30:.0f} GiB of decoded data, over the "
                        f"{MAX_DECODED_BYTES // 2**30} GiB a parbench reader accepts; is it a run folder?")


def check_times(df: pd.DataFrame, columns: list[str], source: str) -> None:
    """Step times are finite and not negative: a row that says otherwise was not written by
    parbench as it stands (an edited or foreign table), and would be ranked fastest. One line naming
    the column, the cell and the value."""
    for col in columns:
        if col not in df:
            continue
        v = pd.to_numeric(df[col], errors="coerce").astype("float64")
        bad = v.notna() & ((v < 0) | ~np.isfinite(v.fillna(0.0)))
        if bad.any():
            i = bad.idxmax()
            cell = df["cell_id"].get(i) if "cell_id" in df else i
            raise UserError(f"{source}: {col} of cell {cell} is {float(v[i])!r}, not a time (finite and >= 0); "
                            "restore the run folder or move the damaged part aside")


def safe_name(text: str, limit: int = 80) -> str:
    """A file name made from a string of a run (a workload, a cell, a run id): its letters, digits
    and ``._=-`` (others become ``_``), no leading dot, and when longer than ``limit`` its first
    ``limit`` characters and a short hash of ``text``, so two long names stay two files."""
    name = re.sub(r"[^A-Za-z0-9._=-]+", "_", text).lstrip(".") or "_"
    return name if len(name) <= limit else f"{name[:limit]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def typed(s: pd.Series, dtype: str, column: str, source: str | None) -> pd.Series:
    """``s`` as ``dtype`` ("Int64", "float64", "boolean", "string"), where every value reads as one
    unambiguously: "1.0" is the integer 1, "" or "nan" is missing. A value that does not ("2.5" as
    an integer, "fast" as a number) is a UserError naming the column, the value and ``source``."""
    if dtype == "string":
        return s.astype("string")
    plain = pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s)
    if dtype == "float64" and plain:
        return s.astype("float64")
    if dtype == "Int64" and pd.api.types.is_integer_dtype(s):
        return s.astype("Int64")
    if dtype == "boolean" and pd.api.types.is_bool_dtype(s):
        return s.astype("boolean")
    read = {"Int64": _integer, "float64": _number, "boolean": _boolean}.get(dtype)
    if read is None:
        return s.astype(dtype)
    if dtype == "Int64" and plain:  # floats: integral ones are the integers they hold
        f = s.to_numpy(float)
        bad = ~np.isnan(f) & ((f % 1 != 0) | ~np.isfinite(f))
        if not bad.any():
            return s.astype("Int64")
    out, seen = [], {}
    for v in s.tolist():
        try:
            key = (type(v), v)
            if key not in seen:
                seen[key] = read(v)
            out.append(seen[key])
        except TypeError:  # unhashable (a list, a dict)
            out.append(read(v))
        except _Unreadable:
            raise UserError(f"{source or 'a table'}: column {column!r} holds {_show(v)}, which is not "
                            f"{_WHAT[dtype]}; correct the value or re-record the run with parbench run") from None
    try:
        return pd.Series(pd.array(out, dtype=dtype), index=s.index, name=s.name)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{source or 'a table'}: column {column!r} holds a value out of range for "
                        f"{_WHAT[dtype]}; correct the value or re-record the run with parbench run") from None


_WHAT = {"Int64": "an integer", "float64": "a number", "boolean": "true or false"}


class _Unreadable(Exception):
    pass


def _missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    if isinstance(v, (float, np.floating)) and math.isnan(v):
        return True
    return isinstance(v, str) and v.strip().lower() in _MISSING


def _number(v: Any) -> float | None:
    if _missing(v):
        return None
    if isinstance(v, (bool, np.bool_)):
        raise _Unreadable
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            raise _Unreadable from None
    raise _Unreadable


def _integer(v: Any) -> int | None:
    if isinstance(v, str) and v.strip().lstrip("+-").isdigit():
        try:
            return int(v.strip())
        except ValueError:  # more digits than Python converts
            raise _Unreadable from None
    if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
        return int(v)
    f = _number(v)
    if f is None:
        return None
    if not math.isfinite(f) or f % 1:
        raise _Unreadable
    return int(f)


def _boolean(v: Any) -> bool | None:
    if _missing(v):
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, float, np.integer, np.floating)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise _Unreadable


def _show(v: Any) -> str:
    """A value for a one-line message: its repr, cut to 40 characters."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
