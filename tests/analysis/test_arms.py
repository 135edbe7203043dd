"""arms: one colour and one position per arm, whatever subset a sweep holds."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import pytest

import analysis.plots as plots
from analysis.arms import ARM_COLORS, FALLBACK_COLORS, arm_color, arm_labels, bitwidth, sorted_arms
from analysis.load import load_sweeps

from .synth import METHODS, write_run


def test_known_arms_have_distinct_fixed_colours():
    for arm in ("bf16", "fp8", "fp8_ppo_is", "tis", "acr", "acr_uaq", "ess", "ais"):
        assert arm_color(arm) == ARM_COLORS[arm]
    assert len(set(ARM_COLORS.values())) == len(ARM_COLORS)
    assert not set(FALLBACK_COLORS) & set(ARM_COLORS.values())


def test_unknown_arm_colour_depends_only_on_its_name():
    assert arm_color("my_new_method") == arm_color("my_new_method")
    assert arm_color("my_new_method") in FALLBACK_COLORS


def test_order_and_labels():
    arms = [("ais", "fp8_e4m3"), ("zzz", "bf16"), ("bf16", "bf16"), ("tis", "int8"), ("tis", "fp8_e4m3")]
    assert sorted_arms(arms) == [("bf16", "bf16"), ("tis", "fp8_e4m3"), ("tis", "int8"), ("ais", "fp8_e4m3"), ("zzz", "bf16")]
    labels = arm_labels(arms)
    assert labels[("ais", "fp8_e4m3")] == "ais"  # the method name, untouched
    assert labels[("tis", "int8")] == "tis [int8]"  # precision only where the name is ambiguous


def test_bitwidth_labels():
    assert bitwidth("bf16") == "BF16"
    assert bitwidth("fp8_e4m3", "per_token") == "FP8 W8A8"
    assert bitwidth("int8", "none") == "INT8 W8A16"
    assert bitwidth("int8", None) == "INT8 W8A8"


@pytest.mark.parametrize("plot", [plots.plot_curves, plots.plot_mismatch])
def test_figures_draw_each_arm_in_its_colour(plot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for method in ("bf16", "tis", "ess"):
        write_run(tmp_path / "sweep", method, "countdown", 0)
        write_run(tmp_path / "sweep", method, "countdown", 1)
    captured = []
    monkeypatch.setattr(plots, "_save", lambda fig, *a, **k: captured.append(fig) or {})
    plot(load_sweeps([tmp_path / "sweep"]), "countdown", "tiny", tmp_path)
    (fig,) = captured
    colours = {mcolors.to_hex(line.get_color()).upper() for ax in fig.axes for line in ax.get_lines()}
    colours -= {mcolors.to_hex("0.5").upper()}  # the dotted "ratio = 1" reference line
    assert colours == {ARM_COLORS[m] for m in ("bf16", "tis", "ess")}
    assert set(METHODS) <= set(ARM_COLORS)
