"""The JSON boundary's type check: a value read back as a dataclass of :mod:`bench.core.spec`,
every field's presence and type checked, a mismatch a :class:`ContractError` naming the field."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union


class ContractError(ValueError):
    """A plan or event that does not match its dataclass."""


def build(tp: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as type ``tp``, checked field by field; ``where`` names the field in the error."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        hints = typing.get_type_hints(tp)
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = set(value) - set(fields)
        if unknown:
            raise ContractError(f"{where}: unknown field(s) {sorted(unknown)}")
        kw = {}
        for name, f in fields.items():
            if name not in value:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ContractError(f"{where}: missing field {name!r}")
                continue
            kw[name] = build(hints[name], value[name], f"{where}.{name}")
        return tp(**kw)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return build(a, value, where)
            except ContractError as e:
                errors.append(str(e))
        raise ContractError(errors[0] if errors else f"{where}: None not allowed")
    if origin is Literal:
        if value not in args:
            raise ContractError(f"{where}: {value!r} not one of {args}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ContractError(f"{where}: expected a list, got {type(value).__name__}")
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if origin is tuple:
            if len(value) != len(args):
                raise ContractError(f"{where}: expected {len(args)} items, got {len(value)}")
            return tuple(build(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        return [build(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)] if args else list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: expected an object, got {type(value).__name__}")
        vt = args[1] if args else Any
        return {str(k): build(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ContractError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ContractError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ContractError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise ContractError(f"{where}: cannot check type {tp!r}")
