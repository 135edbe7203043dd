"""arms: one colour and one position per arm, whatever subset a sweep holds, as each run declares it."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors as mcolors
import pytest

import analysis.plots as plots
from analysis import arms as arms_module
from analysis.arms import FALLBACK_COLORS, method_color, method_diagnostics, arm_labels, bitwidth, learn, sorted_arms
from analysis.load import load_sweeps
from bench.run.identity import Arm

from .synth import ARM_INFO, METHODS, PRECISION_INFO, write_run


def declare_all() -> None:
    for method, info in ARM_INFO.items():
        learn(method, {"method": info})
    for info in PRECISION_INFO.values():
        learn("", {"precision": info})


def test_colours_are_what_the_runs_declare():
    assert method_color("tis") in FALLBACK_COLORS  # nothing declared yet: the name decides
    declare_all()
    for method, info in ARM_INFO.items():
        assert method_color(method) == info["color"]
        assert method_diagnostics(method) == info["diagnostics"]
    assert len({i["color"] for i in ARM_INFO.values()}) == len(ARM_INFO)


def test_undeclared_arm_colour_depends_only_on_its_name():
    declare_all()
    assert method_color("my_new_method") == method_color("my_new_method")
    assert method_color("my_new_method") in FALLBACK_COLORS
    assert method_diagnostics("my_new_method") == {}


def test_order_and_labels():
    declare_all()
    arms = [("ais", "fp8_e4m3"), ("zzz", "bf16"), ("bf16", "bf16"), ("tis", "int8"), ("tis", "fp8_e4m3")]
    # declared order first (bf16 0, tis 30, ais 60), undeclared after; within a method, more bits first
    assert sorted_arms(arms) == [("bf16", "bf16"), ("tis", "fp8_e4m3"), ("tis", "int8"), ("ais", "fp8_e4m3"), ("zzz", "bf16")]
    labels = arm_labels(arms)
    assert labels[("ais", "fp8_e4m3")] == "ais"  # the method name, untouched
    assert labels[("tis", "int8")] == "tis@int8"  # the arm's spelling where the method name is ambiguous


def test_an_arm_is_a_method_at_a_precision_spelt_once():
    # the run identity's Arm is what the analysis keys by: a (method, precision) pair, written <method>@<precision>
    arm = Arm.parse("tis@fp8_e4m3")
    assert (arm.method, arm.precision) == ("tis", "fp8_e4m3") and str(arm) == "tis@fp8_e4m3"
    assert arm == ("tis", "fp8_e4m3") and {arm: 1}[("tis", "fp8_e4m3")] == 1  # a plain pair finds it
    assert all(isinstance(a, Arm) for a in sorted_arms([("tis", "int8"), ("naive", "int8")]))
    with pytest.raises(ValueError, match="'tis' is not an arm"):
        Arm.parse("tis")


def test_bitwidth_labels():
    declare_all()
    assert bitwidth("bf16") == "BF16"
    assert bitwidth("fp8_e4m3", "per_token") == "FP8 W8A8"
    assert bitwidth("int8", "none") == "INT8 W8A16"
    assert bitwidth("int8", None) == "INT8 W8A8"
    learn("", {"precision": {"name": "int4", "label": "INT4", "weight_bits": 4, "act_bits": None}})
    assert bitwidth("int4") == "INT4 W4A16"  # a weight-only format says so itself
    assert bitwidth("never_declared") == "never_declared"


def test_loading_a_sweep_learns_its_declarations(tmp_path: Path):
    write_run(tmp_path / "sweep", "tis", "countdown", 0)
    assert method_color("tis") in FALLBACK_COLORS
    load_sweeps([tmp_path / "sweep"])
    assert method_color("tis") == ARM_INFO["tis"]["color"] and arms_module.precision_label("fp8_e4m3") == "FP8"


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
    assert colours == {ARM_INFO[m]["color"] for m in ("bf16", "tis", "ess")}
    assert set(METHODS) <= set(ARM_INFO)


def test_a_run_before_the_rename_still_declares_its_method(monkeypatch: pytest.MonkeyPatch):
    """run.json wrote the method's declaration under "arm" before 2026-11-28 (an arm is method@precision); the
    analysis reads either key."""
    monkeypatch.setattr(arms_module, "_METHODS", {})
    learn("old_style", {"arm": {"color": "#123456"}})
    learn("new_style", {"method": {"color": "#654321"}})
    assert method_color("old_style") == "#123456" and method_color("new_style") == "#654321"

