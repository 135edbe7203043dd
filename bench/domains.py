"""The allowed values of every numeric config key, declared once, beside the key.

A schema field states its domain where it is defined:

    lr: float = num(1e-4, "(0, 1]")                                   # a real in an interval
    steps: int = num(100, "[1, inf)")                                 # an integer (the annotation says so)
    threads: int = num(0, "[1, 1024]", {0: "leave torch's default"})  # a value outside with a meaning
    is_cap_C: float = num(2.0, "(0, inf]", {math.inf: "no truncation: plain importance sampling"})
    max_length: Optional[int] = num(None, "[2, inf)", {None: "the model's max_position_embeddings"})

The interval is written as in mathematics, `(` open and `[` closed; `inf` inside a closed bracket admits infinity
(`(0, inf]`), inside an open one only finite values. NaN is never admitted. `special` maps values to what they
mean: a value outside the interval that is accepted (0 = "off"), or a value inside it worth naming (inf = "no
cap"); an Optional key must say what `None` means. `bench.launch.config` runs `check_domains` on every section before
any work (the schema's own `check()` keeps only what a domain cannot say: choices, and relations between keys),
and a test walks every numeric key of every registered schema, so a key added without a domain fails there.

This module imports nothing of the suite: every schema, at any floor, can use it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

#: the dataclass field metadata key that holds a field's Domain
DOMAIN = "qrl_domain"

_INTERVAL = re.compile(r"^\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*$")


@dataclass(frozen=True)
class Domain:
    """An interval of the reals, plus named special values (accepted, with the meaning a reader needs)."""

    lo: float
    hi: float
    lo_closed: bool
    hi_closed: bool
    special: tuple[tuple[Any, str], ...] = ()

    @classmethod
    def parse(cls, interval: str, special: Mapping[Any, str] | None = None) -> "Domain":
        m = _INTERVAL.match(interval)
        if m is None:
            raise ValueError(f"domain {interval!r}: write an interval such as '(0, 1]' or '[1, inf)'")
        left, lo, hi, right = m.groups()
        dom = cls(float(lo), float(hi), left == "[", right == "]", tuple((special or {}).items()))
        if not dom.lo <= dom.hi or math.isnan(dom.lo) or math.isnan(dom.hi):
            raise ValueError(f"domain {interval!r}: the lower end must not exceed the upper one")
        return dom

    def admits(self, value: Any) -> bool:
        if any(_same(value, v) for v, _ in self.special):
            return True
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if math.isnan(value):
            return False
        above = value >= self.lo if self.lo_closed else value > self.lo
        below = value <= self.hi if self.hi_closed else value < self.hi
        return above and below

    def interval(self) -> str:
        return (f"{'[' if self.lo_closed else '('}{_fmt(self.lo)}, {_fmt(self.hi)}{']' if self.hi_closed else ')'}")

    def describe(self, integer: bool = False) -> str:
        """'[1, inf) integer; 0 = leave torch's default': the interval, the kind, and each special value."""
        text = f"{self.interval()}{' integer' if integer else ''}"
        return text + "".join(f"; {_fmt(v)} = {meaning}" for v, meaning in self.special)


def num(default: Any, interval: str, special: Mapping[Any, str] | None = None) -> Any:
    """A dataclass field with `default` whose values are restricted to `interval` (plus `special`)."""
    return field(default=default, metadata={DOMAIN: Domain.parse(interval, special)})


@functools.lru_cache(maxsize=None)
def domains(schema: type) -> dict[str, Domain]:
    """{field name: its Domain} of a dataclass schema. A subclass that only changes a key's default
    (`max_new_tokens: int = 120`) keeps the domain its base class declared: the first class in the MRO whose
    field carries one gives it, so a domain is written once however many schemas share the key."""
    out: dict[str, Domain] = {}
    for f in dataclasses.fields(schema):
        for cls in schema.__mro__:
            own = getattr(cls, "__dataclass_fields__", {}).get(f.name)
            if own is not None and DOMAIN in own.metadata:
                out[f.name] = own.metadata[DOMAIN]
                break
    return out


def check_domains(obj: Any, section: str) -> None:
    """ValueError for the first field of the dataclass instance `obj` whose value its domain does not admit:
    `train.lr=1e+30 is out of range; allowed: (0, 1]`."""
    for name, dom in domains(type(obj)).items():
        value = getattr(obj, name)
        if not dom.admits(value):
            raise ValueError(f"{section}.{name}={_fmt(value)} is out of range; allowed: "
                             f"{dom.describe(numeric_kind(type(obj), name) is int)}")


@functools.lru_cache(maxsize=None)
def numeric_kind(schema: type, name: str) -> type | None:
    """int or float for a field annotated int / float / Optional of either; None for any other field."""
    hint = typing.get_type_hints(schema)[name]
    args = [a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in (int, float) else None


def check_schema(obj: Any, section: str) -> None:
    """The one check of a schema instance: its declared domains, then its own `check()` (choices and relations
    between keys, which a domain cannot state)."""
    check_domains(obj, section)
    check = getattr(obj, "check", None)
    if check is not None:
        check()


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    return isinstance(a, (int, float)) and a == b


def _fmt(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v.is_integer() and abs(v) < 1e5:
            return str(int(v))
        if abs(v) >= 1e5 or abs(v) < 1e-4:  # 1e30, 1e-8: as a user writes them
            return f"{v:.6g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")
    return repr(v) if isinstance(v, float) else str(v)
