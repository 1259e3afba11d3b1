"""A cell's layout over its ranks as one typed value: named dimensions and their degrees.

The 2D hybrids take theirs from the ``mesh`` option ("DPxMP", e.g. 2x2; none: dp=2, the rest model
parallel), parsed here and nowhere else; the one-dimensional strategies name theirs (pp4, tp4,
chain2, split2). The label a row records (``dp2xtp2``) reads back into the same value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_OPTION = re.compile(r"\s*(\d+)\s*x\s*(\d+)\s*")
_DIM = re.compile(r"([a-z]+)(\d+)")


@dataclass(frozen=True)
class Mesh:
    """Dimensions (name, degree), outermost first: ``Mesh((("dp", 2), ("tp", 2)))`` is dp2xtp2."""

    dims: tuple[tuple[str, int], ...]

    @classmethod
    def grid(cls, option: str | None, world: int, model: str) -> Mesh:
        """The data-parallel x ``model``-parallel mesh the option ``option`` asks for ("2x2"; None:
        dp=2, the rest of the ``world`` ranks model parallel). ValueError with the fix otherwise."""
        if option is None:
            return cls((("dp", 2), (model, max(world // 2, 1))))
        m = _OPTION.fullmatch(str(option).lower())
        if not m:
            raise ValueError(f"mesh {option!r} must look like 2x2 (data parallel x model parallel)")
        dp, mp = int(m[1]), int(m[2])
        if dp < 1 or mp < 1:
            raise ValueError(f"mesh {option!r}: both degrees must be >= 1, e.g. 2x2")
        return cls((("dp", dp), (model, mp)))

    @classmethod
    def line(cls, name: str, degree: int) -> Mesh:
        """One dimension: a pipeline's stages (pp), tensor parallelism (tp), a chain, a layer split."""
        return cls(((name, degree),))

    @classmethod
    def from_label(cls, label: str) -> Mesh:
        """The mesh a row's ``mesh`` label names ("dp2xtp2", "pp4"); ValueError otherwise."""
        dims = []
        for part in str(label).split("x"):
            m = _DIM.fullmatch(part)
            if not m:
                raise ValueError(f"mesh label {label!r} is not of the form dp2xtp2 or pp4")
            dims.append((m[1], int(m[2])))
        return cls(tuple(dims))

    def degree(self, name: str) -> int:
        """The degree of dimension ``name`` (1 when the mesh has none)."""
        return next((d for n, d in self.dims if n == name), 1)

    @property
    def dp(self) -> int:
        return self.degree("dp")

    @property
    def mp(self) -> int:
        """The degree of the model-parallel dimension (the last one)."""
        return self.dims[-1][1]

    @property
    def size(self) -> int:
        out = 1
        for _, d in self.dims:
            out *= d
        return out

    @property
    def label(self) -> str:
        """'dp2xtp2'; a data-parallel degree of 1 is left out ('pp4')."""
        dims = [(n, d) for n, d in self.dims if not (n == "dp" and d == 1 and len(self.dims) > 1)]
        return "x".join(f"{n}{d}" for n, d in dims)
