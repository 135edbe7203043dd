"""How arms are ordered, coloured and labelled, shared by figures and tables.

Nothing here lists the arms: each method declares its colour, its table position and its diagnostics where it is
defined (bench/methods/<method>.py), the trainer records that in every run's run.json (`method`; `arm` before
2026-11-28), together with the rollout precision's label and bit widths (`precision`), and the loader hands each
run's declaration to `learn`.
So a new arm or precision appears in every figure and table without a change here; a run that declares
nothing (an older run directory) gets a colour derived from its method's name and sorts after the known ones.
An arm (`Arm`: a method at a rollout precision, bench/run/identity.py) is labelled by its method, and as
`<method>@<precision>` where the method runs at two precisions.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable

from bench.run.identity import BASELINE, NAIVE, Arm

# Okabe-Ito-like palette for methods that declare no colour: chosen by a hash of the name, so it does not
# depend on which other methods are in the sweep.
FALLBACK_COLORS = ["#7F7F7F", "#9467BD", "#BCBD22", "#17BECF", "#8C564B", "#E377C2", "#1F77B4", "#2CA02C"]
PRECISION_LINESTYLES = ["-", "--", ":", "-."]
UNDECLARED_ORDER = 1000
#: BASELINE and NAIVE, the default `--baseline` and `--naive`, are written once in bench/run/identity.py (the dry
#: run's seed planner counts the comparisons with naive too): the CLI's help, SeverityOptions and every table's and
#: figure's default read them from here.
#: The default `--control`: the on-policy quantized control (the trainer at the rollout's precision, so pi_old = mu),
#: which splits a naive gap into the sampler-and-capacity cost and the mismatch cost (analysis/decomposition.py).
CONTROL = "matched"

#: method -> {"color", "order", "diagnostics"}, precision -> {"label", "weight_bits", "act_bits", ...}
_METHODS: dict[str, dict[str, Any]] = {}
_PRECISIONS: dict[str, dict[str, Any]] = {}


def learn(method: str, info: dict[str, Any]) -> None:
    """Record what a run's run.json declares about its method and its rollout precision (runs before 2026-11-28
    wrote the method's declaration under "arm")."""
    declared = info.get("method", info.get("arm"))
    if isinstance(declared, dict):
        _METHODS[method] = declared
    precision = info.get("precision")
    if isinstance(precision, dict) and isinstance(precision.get("name"), str):
        _PRECISIONS[precision["name"]] = precision


def forget() -> None:
    """Drop every declaration (tests; a fresh analysis in the same process)."""
    _METHODS.clear()
    _PRECISIONS.clear()


def method_color(method: str) -> str:
    color = _METHODS.get(method, {}).get("color")
    if isinstance(color, str):
        return color
    return FALLBACK_COLORS[zlib.crc32(method.encode()) % len(FALLBACK_COLORS)]


def method_diagnostics(method: str) -> dict[str, str]:
    """The `method/<arm>/<key>` metrics the arm asks to be plotted: key -> panel title."""
    return dict(_METHODS.get(method, {}).get("diagnostics") or {})


def precision_label(precision: str) -> str:
    return str(_PRECISIONS.get(precision, {}).get("label") or precision)


def precision_bits(precision: str) -> int:
    bits = _PRECISIONS.get(precision, {}).get("weight_bits")
    return int(bits) if isinstance(bits, int) else 0


def is_emulated(precision: str, device: str) -> bool:
    """A quantized rollout precision (declared weight bits below 16) computed on a CPU: its low-precision GEMMs
    are emulated (fake quantization, fp32 arithmetic), so its speed says nothing about real FP8/INT8 kernels."""
    return device == "cpu" and 0 < precision_bits(precision) < 16


def rollout_label(precision: str, device: str) -> str:
    """The precision as a throughput row names it: "FP8", or "FP8 (emulated)" for a CPU row."""
    return precision_label(precision) + (" (emulated)" if is_emulated(precision, device) else "")


def method_sort_key(method: str) -> tuple[int, str]:
    """Declared order (the baseline first), undeclared methods after, alphabetically."""
    order = _METHODS.get(method, {}).get("order")
    return (int(order) if isinstance(order, int) else UNDECLARED_ORDER, method)


def arm_sort_key(arm: tuple[str, str]) -> tuple[int, str, int, str]:
    method, precision = arm
    return (*method_sort_key(method), -precision_bits(precision), precision)


def sorted_arms(arms: Iterable[tuple[str, str]]) -> list[Arm]:
    """The arms, each once, in the report's order; (method, precision) pairs are taken as arms."""
    return [Arm(*a) for a in sorted(set(arms), key=arm_sort_key)]


def arm_labels(arms: Iterable[tuple[str, str]]) -> dict[Arm, str]:
    """Legend/row label per arm: the method name, spelled as the arm `<method>@<precision>` (bench/run/identity.py)
    where the method appears at two precisions."""
    arms = sorted_arms(arms)
    counts: dict[str, int] = {}
    for m, _ in arms:
        counts[m] = counts.get(m, 0) + 1
    return {a: (a.method if counts[a.method] == 1 else str(a)) for a in arms}


def arm_linestyle(arm: Arm, arms: Iterable[tuple[str, str]]) -> str:
    """Solid for a method's highest precision; other precisions of the same method get dashes/dots."""
    same = [a for a in sorted_arms(arms) if a[0] == arm[0]]
    return PRECISION_LINESTYLES[same.index(arm) % len(PRECISION_LINESTYLES)] if arm in same else "-"


def bitwidth(precision: str, act_granularity: Any = None) -> str:
    """The 'Bitwidth' cell of a paper-style table: BF16, or FP8/INT8/... with W<bits>A<bits>.

    Activations count as quantized at the weights' width unless the run declared otherwise (`act_bits`) or
    rollout.act_granularity is "none" (weight-only): then they stay in 16 bits.
    """
    declared = _PRECISIONS.get(precision, {})
    name, bits = precision_label(precision), precision_bits(precision)
    if not bits or bits >= 16:
        return name
    weight_only = isinstance(act_granularity, str) and act_granularity.lower() == "none"
    abits = declared.get("act_bits", bits) if declared else bits
    if weight_only or abits is None:
        abits = 16
    return f"{name} W{bits}A{abits}"
