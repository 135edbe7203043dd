"""How arms are ordered, coloured and labelled, shared by figures and tables.

One mapping for the whole package so that `tis` is the same blue in every figure and the same row position
in every table, whatever subset of arms a sweep happens to contain. The method name is always the run's own
`method.name`; the rollout precision is added to a label only when one method appears at two precisions.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterable

# Okabe-Ito palette (distinguishable under the common colour-vision deficiencies), black for the baseline.
ARM_COLORS: dict[str, str] = {
    "bf16": "#000000",
    "fp8": "#D55E00",
    "fp8_ppo_is": "#E69F00",
    "tis": "#0072B2",
    "acr": "#56B4E9",
    "acr_uaq": "#009E73",
    "ess": "#CC79A7",
    "ais": "#8C510A",
}
ARM_ORDER: list[str] = list(ARM_COLORS)
# For methods this package does not know yet: a colour chosen by a hash of the name, so it does not depend
# on which other unknown methods are in the sweep.
FALLBACK_COLORS = ["#7F7F7F", "#9467BD", "#BCBD22", "#17BECF", "#8C564B", "#E377C2", "#1F77B4", "#2CA02C"]
PRECISION_LINESTYLES = ["-", "--", ":", "-."]

PRECISION_NAMES = {"bf16": "BF16", "fp32": "FP32", "fp8_e4m3": "FP8", "int8": "INT8"}
PRECISION_BITS = {"bf16": 16, "fp32": 32, "fp8_e4m3": 8, "int8": 8}


def arm_color(method: str) -> str:
    if method in ARM_COLORS:
        return ARM_COLORS[method]
    return FALLBACK_COLORS[zlib.crc32(method.encode()) % len(FALLBACK_COLORS)]


def method_sort_key(method: str) -> tuple[int, str]:
    """Known arms in the canonical order (baseline first), unknown ones after, alphabetically."""
    return (ARM_ORDER.index(method), "") if method in ARM_ORDER else (len(ARM_ORDER), method)


def arm_sort_key(arm: tuple[str, str]) -> tuple[int, str, int, str]:
    method, precision = arm
    bits = PRECISION_BITS.get(precision, 0)
    return (*method_sort_key(method), -bits, precision)


def sorted_arms(arms: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted(set(arms), key=arm_sort_key)


def arm_labels(arms: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Legend/row label per arm: the method name, plus `[precision]` only where the method is ambiguous."""
    arms = sorted_arms(arms)
    counts: dict[str, int] = {}
    for m, _ in arms:
        counts[m] = counts.get(m, 0) + 1
    return {(m, p): (m if counts[m] == 1 else f"{m} [{p}]") for m, p in arms}


def arm_linestyle(arm: tuple[str, str], arms: Iterable[tuple[str, str]]) -> str:
    """Solid for a method's highest precision; other precisions of the same method get dashes/dots."""
    same = [a for a in sorted_arms(arms) if a[0] == arm[0]]
    return PRECISION_LINESTYLES[same.index(arm) % len(PRECISION_LINESTYLES)] if arm in same else "-"


def bitwidth(precision: str, act_granularity: Any = None) -> str:
    """The 'Bitwidth' cell of a paper-style table: BF16, or FP8/INT8 with W<bits>A<bits>.

    Activations are quantized unless rollout.act_granularity is "none" (weight-only), in which case they
    stay in 16 bits.
    """
    name = PRECISION_NAMES.get(precision, precision)
    bits = PRECISION_BITS.get(precision)
    if bits is None or bits >= 16:
        return name
    abits = 16 if isinstance(act_granularity, str) and act_granularity.lower() == "none" else bits
    return f"{name} W{bits}A{abits}"
