"""The naive gap split by the on-policy control (analysis/decomposition.py), every paired comparison with raw and
Holm-adjusted p (analysis/comparisons.py), the pre-registered family, rliable's aggregates (analysis/aggregate.py) and
the collapse definition (analysis/collapse.py), on synthetic runs whose per-seed values are set by hand."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.stats as sps

from analysis.aggregate import aggregates, iqm, poi_cell, probability_of_improvement, stratified_interval
from analysis.collapse import collapse_margin, collapse_step
from analysis.comparisons import paired_comparisons
from analysis.decomposition import decomposition
from analysis.inference import holm
from analysis.load import load_sweeps
from analysis.runs import SeverityOptions
from analysis.verdict import verdict

from .synth import EVAL_STEPS, write_run

SEEDS = [0, 1, 2, 3]
FINAL = {  # final accuracies per seed: bf16 - naive = 20 = (bf16 - matched 10) + (matched - naive 10); tis - naive 5
    "bf16": [0.60, 0.62, 0.58, 0.64],
    "naive": [0.40, 0.44, 0.38, 0.42],
    "matched": [0.50, 0.55, 0.47, 0.52],
    "tis": [0.45, 0.50, 0.41, 0.48],
}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("decomp")
    for method, finals in FINAL.items():
        for seed, f in zip(SEEDS, finals):
            curve = [0.2 + (f - 0.2) * i / 3 for i in range(len(EVAL_STEPS))]
            write_run(root, method, "arithmetic", seed, precision="bf16" if method == "bf16" else "fp8_e4m3",
                      eval_values=curve)
    return load_sweeps([root])


def test_costs_and_shares_by_hand(sweep):
    d = decomposition(sweep, SeverityOptions())
    assert set(d["method"]) == {"naive", "matched", "tis"}
    r = d.set_index("method").loc["tis"]
    assert (r.total_cost, r.sampler_cost, r.mismatch_cost) == pytest.approx((20.0, 10.0, 10.0))
    assert r.total_cost_ci == "paired t" and r.total_cost_n == 4
    assert r.share_total == pytest.approx(0.25) and r.share_mismatch == pytest.approx(0.5)
    assert r.share_mismatch_lo < 0.5 < r.share_mismatch_hi  # Fieller over the paired seeds
    mism = np.subtract(FINAL["matched"], FINAL["naive"]) * 100
    half = sps.t.ppf(0.975, 3) * mism.std(ddof=1) / 2
    assert (r.mismatch_cost_lo, r.mismatch_cost_hi) == pytest.approx((10 - half, 10 + half))
    ctrl = d.set_index("method").loc["matched"]
    assert np.isnan(ctrl.share_total) and np.isnan(ctrl.share_mismatch)  # the control is the denominator


def test_costs_use_the_seeds_all_three_share(tmp_path):
    """Seeds some of bf16, naive and matched lack (naive without 3 but with 9, matched without 0) are left out of every
    cost: each is a paired t over the same seeds (1 and 2), and total = sampler + mismatch."""
    for method, finals in FINAL.items():
        for seed, f in zip(SEEDS, finals):
            if (method, seed) in (("naive", 3), ("matched", 0)):
                continue
            write_run(tmp_path, method, "arithmetic", seed, precision="bf16" if method == "bf16" else "fp8_e4m3",
                      eval_values=[0.2 + (f - 0.2) * i / 3 for i in range(len(EVAL_STEPS))])
    write_run(tmp_path, "naive", "arithmetic", 9, precision="fp8_e4m3", eval_values=[0.2, 0.1, 0.0, 0.0])
    r = decomposition(load_sweeps([tmp_path]), SeverityOptions()).set_index("method").loc["tis"]
    assert (r.total_cost_n, r.sampler_cost_n, r.mismatch_cost_n) == (2, 2, 2)
    assert {r.total_cost_ci, r.sampler_cost_ci, r.mismatch_cost_ci} == {"paired t"}
    assert r.total_cost == pytest.approx(r.sampler_cost + r.mismatch_cost)
    on = [1, 2]  # the expected total over them, by hand
    assert r.total_cost == pytest.approx(np.mean([(FINAL["bf16"][s] - FINAL["naive"][s]) * 100 for s in on]))


def _write(root, skip=(), finals=FINAL):
    for method, values in finals.items():
        for seed, f in zip(SEEDS, values):
            if (method, seed) not in skip:
                write_run(root, method, "arithmetic", seed, precision="bf16" if method == "bf16" else "fp8_e4m3",
                          eval_values=[0.2 + (f - 0.2) * i / 3 for i in range(len(EVAL_STEPS))])
    return load_sweeps([root])


def test_the_verdict_puts_beside_a_cost_only_the_p_of_its_own_test(tmp_path):
    """A cost's Holm p comes from the paired comparisons' row only when that test rests on the cost's pairs: with a
    control seed missing, both pair on seeds 0-2 (it printed Holm 0.325 of a Welch test beside a paired interval
    whose p is 0.006); with a bf16 seed missing, the cost pairs on 3 seeds and the family's test on 4: the cost's own
    p, said to be unadjusted."""
    text = " ".join(verdict(_write(tmp_path / "a", skip={("matched", 3)}), SeverityOptions()))
    mism = np.subtract(FINAL["matched"][:3], FINAL["naive"][:3]) * 100
    ctrl_naive = paired_comparisons(load_sweeps([tmp_path / "a"]), SeverityOptions())
    row = ctrl_naive[(ctrl_naive["a"] == "matched") & (ctrl_naive["b"] == "naive") & (ctrl_naive["endpoint"] == "final")]
    assert row["gap_n"].iloc[0] == 3 and row["p_raw"].iloc[0] == pytest.approx(sps.ttest_1samp(mism, 0).pvalue)
    assert f"mismatch cost matched − naive +{mism.mean():.1f} pp" in text
    assert f"n=3; Holm {row['p_holm'].iloc[0]:.3f}" in text
    text = " ".join(verdict(_write(tmp_path / "b", skip={("bf16", 3)}), SeverityOptions()))
    p = sps.ttest_1samp(mism, 0).pvalue
    assert f"n=3; p {p:.3f}, not Holm-adjusted (on the seeds all three ran)" in text


def test_families_holm_and_the_primary_comparisons(sweep):
    c = paired_comparisons(sweep, SeverityOptions(primary=("matched", "tis")))
    assert set(c["family"]) == {"vs bf16", "primary"}  # every other arm is primary here: no exploratory vs naive left
    prim = c[c["family"] == "primary"]
    assert len(prim) == 4 and set(prim["alternative"]) == {"greater"} and set(prim["primary"]) == {"True"}
    np.testing.assert_allclose(prim["p_holm"], holm(prim["p_raw"].to_numpy()))  # one family over both endpoints
    base = c[(c["family"] == "vs bf16") & (c["endpoint"] == "final")]
    assert len(base) == 3  # naive, matched, tis against bf16
    np.testing.assert_allclose(base["p_holm"], holm(base["p_raw"].to_numpy()))
    tis = prim[(prim["a"] == "tis") & (prim["endpoint"] == "final")].iloc[0]
    d = np.subtract(FINAL["tis"], FINAL["naive"]) * 100
    assert tis.p_raw == pytest.approx(sps.ttest_1samp(d, 0, alternative="greater").pvalue)
    assert tis.sd_diff == pytest.approx(d.std(ddof=1))
    plain = paired_comparisons(sweep, SeverityOptions())
    assert set(plain["family"]) == {"vs bf16", "vs naive"} and not (plain["primary"] == "True").any()


def test_verdict_names_families_the_decomposition_and_the_preregistered_test(sweep):
    text = " ".join(verdict(sweep, SeverityOptions(primary=("matched", "tis"))))
    assert "Pre-registered test (one-sided paired t, Holm over its 4 tests" in text
    assert "tis > naive at fp8_e4m3" in text and "supported" in text
    assert "splits the naive gap: at fp8_e4m3 (a=per_token) the total gap bf16 − naive +20.0 pp" in text
    assert "sampler-and-capacity cost bf16 − matched +10.0 pp" in text and "mismatch cost matched − naive +10.0 pp" in text
    assert "After Holm over its 3 comparisons" in text


def test_aggregates_probability_of_improvement_and_iqm(sweep):
    # P(X > Y) is the Mann-Whitney U statistic over N x M run pairs, ties 1/2
    assert poi_cell(np.array([1.0, 3.0]), np.array([2.0, 3.0])) == pytest.approx((0 + 0 + 1 + 0.5) / 4)
    assert probability_of_improvement([(np.array([2.0]), np.array([1.0])), (np.array([0.0]), np.array([1.0]))]) == 0.5
    x = np.arange(8.0)
    assert iqm([x[:4], x[4:]]) == pytest.approx(sps.trim_mean(x, 0.25)) == pytest.approx(3.5)
    lo, hi = stratified_interval(iqm, [x[:4], x[4:]], reps=500)
    assert lo <= 3.5 <= hi and (lo, hi) == stratified_interval(iqm, [x[:4], x[4:]], reps=500)  # deterministic
    a = aggregates(sweep, SeverityOptions(), reps=200).set_index("method")
    assert a.loc["tis", "poi_naive"] == pytest.approx(poi_cell(np.array(FINAL["tis"]), np.array(FINAL["naive"])))
    assert a.loc["naive", "poi_base"] == 0.0 and a.loc["tis", "poi_naive_n"] == 1
    assert np.isnan(a.loc["tis", "iqm"])  # one cell: no IQM (needs 3)


def test_collapse_is_a_drop_beyond_the_evaluations_noise():
    # 200 problems at p0 = 0.395: margin 1.96 * sqrt(2 * 0.395 * 0.605 / 200) = 0.0958
    assert collapse_margin(0.395, 200) == pytest.approx(0.0958, abs=1e-4)
    assert collapse_margin(0.395, 1000) == pytest.approx(0.0429, abs=1e-4) and collapse_margin(0.4, None) == 0.0
    steps = [0, 10, 20, 30]
    assert collapse_step(steps, [0.395, 0.385, 0.38, 0.385], 3, 200) is None  # 1 pp under the start: noise
    assert collapse_step(steps, [0.395, 0.29, 0.25, 0.20], 3, 200) == 10  # 0.30 would sit on the margin (0.299)
    assert collapse_step(steps, [0.395, 0.30, 0.25, 0.20], 3, None) == 10  # no n_test: any drop counts
    assert collapse_step(steps, [0.395, 0.30, 0.40, 0.20], 2, 200) is None  # not consecutive


def test_the_primary_family_drops_seeds_some_of_its_arms_lack(tmp_path):
    """naive ran 2 more seeds than tis: the pre-registered test pairs the 4 common seeds (not Welch over 6 vs 4)."""
    for method, finals in {"naive": FINAL["naive"] + [0.10, 0.12], "tis": FINAL["tis"]}.items():
        for seed, f in enumerate(finals):
            write_run(tmp_path, method, "arithmetic", seed, precision="fp8_e4m3",
                      eval_values=[0.2 + (f - 0.2) * i / 3 for i in range(len(EVAL_STEPS))])
    c = paired_comparisons(load_sweeps([tmp_path]), SeverityOptions(primary=("tis",)))
    tis = c[(c["family"] == "primary") & (c["endpoint"] == "final")].iloc[0]
    d = np.subtract(FINAL["tis"], FINAL["naive"]) * 100
    assert (tis.gap_ci, tis.gap_n) == ("paired t", 4) and tis.gap == pytest.approx(d.mean())
    assert tis.p_raw == pytest.approx(sps.ttest_1samp(d, 0, alternative="greater").pvalue)


def test_the_verdict_counts_in_a_holm_family_only_the_tested_comparisons(tmp_path):
    """An arm with 1 seed has a gap but no test: it is not in the family Holm adjusts over, and the sentence says so
    (it said "over its 3 comparisons" of a family adjusted over 2)."""
    finals = {"bf16": [0.60, 0.70, 0.65], "naive": [0.30, 0.36, 0.33], "ess": [0.50, 0.62, 0.55], "tis": [0.50]}
    for method, values in finals.items():
        for seed, f in enumerate(values):
            write_run(tmp_path, method, "arithmetic", seed, precision="bf16" if method == "bf16" else "fp8_e4m3",
                      final_acc=f)
    sweep = load_sweeps([tmp_path])
    c = paired_comparisons(sweep, SeverityOptions())
    base = c[(c["family"] == "vs bf16") & (c["endpoint"] == "final")]
    assert np.isfinite(base["p_holm"]).sum() == 2 and len(base) == 3
    text = " ".join(verdict(sweep, SeverityOptions()))
    assert "Holm over its 2 comparisons (1 more with no test: fewer than 2 seeds)" in text


def test_the_preregistered_test_is_one_hypothesis_per_rollout_setting(tmp_path):
    """tis at two precisions: each is its own hypothesis with its own numbers and decision. The verdict put both
    severities' endpoints under the first one's label ("tis > naive at int8: final ...; final ...") and decided
    "supported" for all of them together."""
    better = {"naive": FINAL["naive"], "tis": [v + d for v, d in zip(FINAL["naive"], (0.05, 0.06, 0.03, 0.06))]}
    same = {"naive": FINAL["naive"], "tis": [v + d for v, d in zip(FINAL["naive"], (0.01, -0.02, 0.0, -0.01))]}
    for precision, finals in (("fp8_e4m3", better), ("int8", same)):
        for method, values in finals.items():
            for seed, f in zip(SEEDS, values):
                write_run(tmp_path / precision, method, "arithmetic", seed, precision=precision,
                          eval_values=[0.2 + (f - 0.2) * i / 3 for i in range(len(EVAL_STEPS))])
    text = " ".join(verdict(load_sweeps([tmp_path / "fp8_e4m3", tmp_path / "int8"]), SeverityOptions(primary=("tis",))))
    found = {at: (ends, decision) for at, ends, decision in
             re.findall(r"tis > naive at (\S+)[^:]*: (.*?): \*\*(supported|not supported)\*\*", text)}
    assert set(found) == {"fp8_e4m3", "int8"}, text
    (fp8, fp8_decision), (int8, int8_decision) = found["fp8_e4m3"], found["int8"]
    assert fp8.count("final ") == 1 and fp8.startswith("final +5.0 pp") and fp8_decision == "supported"
    assert int8.count("final ") == 1 and int8.startswith("final -0.5 pp") and int8_decision == "not supported"


def test_naive_as_the_baseline_counts_each_comparison_once(sweep):
    """`--baseline naive`: "vs naive" is the baseline family itself; each comparison was listed twice and Holm
    counted 5 where there are 3."""
    c = paired_comparisons(sweep, SeverityOptions(baseline="naive"))
    final = c[c["endpoint"] == "final"]
    assert set(final["family"]) == {"vs naive"} and sorted(final["a"]) == ["bf16", "matched", "tis"]
    np.testing.assert_allclose(final["p_holm"], holm(final["p_raw"].to_numpy()))


def test_a_share_of_a_naive_gap_that_holm_does_not_resolve_says_so(tmp_path):
    """A share is defined where the naive gap's raw interval excludes 0; the verdict's previous sentence said no arm
    differs after Holm, then gave the share of that gap as if it were a finding."""
    finals = {"bf16": [0.60, 0.62, 0.58, 0.64], "naive": [0.57, 0.56, 0.57, 0.59], "tis": [0.59, 0.58, 0.58, 0.61]}
    sweep = _write(tmp_path, finals=finals)
    c = paired_comparisons(sweep, SeverityOptions())
    naive = c[(c["family"] == "vs bf16") & (c["a"] == "naive") & (c["endpoint"] == "final")].iloc[0]
    assert naive.gap_hi < 0 and naive.p_holm > 0.05, naive  # the case: resolved raw, not after Holm
    text = " ".join(verdict(sweep, SeverityOptions()))
    assert "No arm differs from bf16 after Holm" in text
    assert f"of a naive gap that does not differ after Holm ({naive.p_holm:.3f})" in text, text
    assert "does not differ after Holm (" not in " ".join(verdict(_write(tmp_path / "strong"), SeverityOptions()))


def test_the_preregistered_family_drops_a_seed_any_of_its_five_arms_lacks_and_says_so(tmp_path):
    """docs/preregistration.md: a seed missing in any of bf16, naive and the primary arms is dropped from every test,
    and the result says so. bf16's missing seed was kept (n = 4 where the protocol gives 3), and nothing was said."""
    sweep = _write(tmp_path, skip={("bf16", 2)})
    c = paired_comparisons(sweep, SeverityOptions(primary=("matched", "tis")))
    prim = c[c["family"] == "primary"]
    assert set(prim["gap_n"]) == {3}
    d = (np.subtract(FINAL["tis"], FINAL["naive"]) * 100)[[0, 1, 3]]
    tis = prim[(prim["a"] == "tis") & (prim["endpoint"] == "final")].iloc[0]
    assert tis.p_raw == pytest.approx(sps.ttest_1samp(d, 0, alternative="greater").pvalue)
    text = " ".join(verdict(sweep, SeverityOptions(primary=("matched", "tis"))))
    assert "seed 2 dropped from every test (missing in one of the family's arms)" in text, text
    assert "dropped from every test" not in " ".join(verdict(_write(tmp_path / "all"), SeverityOptions(primary=("tis",))))
