"""The seed calculator of `--dry-run` (bench/launch/power.py): the paired t-test's power, the seeds a target effect
needs, the paired SD read back from a prior report, and the warning when a sweep has fewer seeds."""

import math

import pytest
from omegaconf import OmegaConf
from scipy.stats import norm

from bench.launch.power import (DEFAULT_PAIRED_SD_PP, PowerConfig, detectable_effect, paired_power, power_lines,
                                prior_paired_sd, seeds_needed)


def test_power_matches_the_normal_approximation_at_large_n():
    # n = 2000 pairs: the t distribution is the normal one; power = Phi(d sqrt(n) - z_{1 - alpha/2}) (+ the other tail)
    d, sd, n = 0.3, 7.7, 2000
    approx = norm.sf(norm.ppf(0.975) - d * math.sqrt(n) / sd) + norm.cdf(-norm.ppf(0.975) - d * math.sqrt(n) / sd)
    assert paired_power(n, d, sd) == pytest.approx(approx, abs=2e-3)
    assert paired_power(n, 0.0, sd) == pytest.approx(0.05, abs=1e-9)  # no effect: the test's level
    assert paired_power(n, d, sd, sided=1) > paired_power(n, d, sd)  # a directional test is stronger


def test_seeds_needed_is_the_smallest_n_reaching_the_power():
    n = seeds_needed(6.9, 7.7, sided=1, tests=6)
    assert paired_power(n, 6.9, 7.7, 0.05 / 6, 1) >= 0.8 > paired_power(n - 1, 6.9, 7.7, 0.05 / 6, 1)
    assert seeds_needed(5.0, 7.7) > seeds_needed(10.0, 7.7) > seeds_needed(20.0, 7.7) >= 2
    assert seeds_needed(6.9, 7.7, tests=3) > seeds_needed(6.9, 7.7)  # a corrected family needs more
    # issue 35: at 4 seeds and a paired SD of 7.7 pp the smallest effect found with 80 % power is ~16 pp
    assert detectable_effect(4, 7.7) == pytest.approx(16.4, abs=0.1)


def test_prior_sd_from_a_reports_tables(tmp_path):
    tables = tmp_path / "report" / "tables"
    tables.mkdir(parents=True)
    # severity.csv's long format: a paired gap [-24.1, -4.9] over n = 4 gives sd = 9.6 * 2 / t(0.975, 3) = 6.03
    (tables / "severity.csv").write_text("metric,value,lo,hi,n,interval\ngap_to_bf16,-14.5,-24.1,-4.9,4,paired t\n"
                                         "gap_to_bf16,-3.0,-9.0,3.0,3,Welch\nacc,40,30,50,4,t\n")
    sd, source = prior_paired_sd(tmp_path / "report")
    assert sd == pytest.approx(9.6 * 2 / 3.182446, rel=1e-4) and "severity.csv" in source
    (tables / "paired.csv").write_text("endpoint,metric,value\nfinal,sd_diff,4.0\nauc,sd_diff,1.0\nfinal,sd_diff,6.0\n"
                                       "final,sd_diff,5.0\nfinal,diff,-9.0\n")
    # paired.csv wins; final accuracy only; pooled (root mean square), not the median of a few n = 4 SDs (biased low)
    assert prior_paired_sd(tmp_path / "report")[0] == pytest.approx(math.sqrt((16 + 36 + 25) / 3))
    # the comparisons with naive where the report has them (not the gaps to bf16 nor a collapsed arm's against bf16)
    (tables / "paired.csv").write_text("endpoint,a,b,metric,value\nfinal,tis,naive,sd_diff,8.0\nfinal,naive,bf16,sd_diff,3.0\n"
                                       "final,ess,bf16,sd_diff,1.4\nfinal,geo_rs,naive,sd_diff,6.0\n")
    sd, source = prior_paired_sd(tmp_path / "report")
    assert sd == pytest.approx(math.sqrt((64 + 36) / 2)) and "pooled over 2 paired comparisons" in source
    assert prior_paired_sd(tmp_path / "none") is None


def test_power_lines_warn_when_a_sweep_has_too_few_seeds(tmp_path):
    cfg = OmegaConf.create({"power": PowerConfig(effect_pp=5.0)})
    lines, short = power_lines(cfg, 4, tmp_path)
    assert short and lines[-1].startswith("WARNING: 4 seed(s)") and f"{DEFAULT_PAIRED_SD_PP:.2f} pp" in lines[0]
    lines, short = power_lines(OmegaConf.create({"power": PowerConfig(effect_pp=30.0)}), 4, tmp_path)
    assert not short and len(lines) == 1
    with pytest.raises(ValueError, match="power.sided=3"):
        PowerConfig(sided=3).check()


def test_one_seed_per_arm_allows_no_paired_test(tmp_path):
    """One pair has no spread to estimate: the line says so instead of n = 2's detectable effect."""
    cfg = OmegaConf.create({"power": PowerConfig(effect_pp=5.0)})
    (one, *_), short = power_lines(cfg, 1, tmp_path)
    assert short and "runs 1 seed(s) per arm, which allow no paired test" in one and "which detect" not in one
    two = power_lines(cfg, 2, tmp_path)[0][0]
    assert f"which detect {detectable_effect(2, DEFAULT_PAIRED_SD_PP, 0.05, 0.8, 2, 1):.1f} pp" in two


def test_two_sided_power_is_never_nan_where_the_lower_tail_is_negligible():
    """scipy's nct.cdf(-crit, df, nc) is NaN there (nct.cdf(-12.7, 1, 8)): every two-sided power at such points was
    NaN, and the seed search stopped too early (literature_slice: "2 seeds give 80 %", whose true power is 0.166).
    Reference values: statsmodels TTestPower / a 400k-draw simulation (the trial that found it)."""
    assert paired_power(2, 6.0, 1.06, 0.05 / 3) == pytest.approx(0.1660, abs=5e-4)
    assert paired_power(3, 6.0, 1.06, 0.05 / 3) == pytest.approx(0.7992, abs=5e-4)
    assert seeds_needed(6.0, 1.06, tests=3) == 4
    for n, tests, effect in ((2, 1, 88.93), (2, 6, 533.1), (3, 3, 43.64), (3, 6, 61.75), (4, 12, 38.53)):
        assert detectable_effect(n, 7.7, tests=tests) == pytest.approx(effect, rel=2e-3), (n, tests)
    with pytest.raises(ValueError, match="must be > 0"):
        seeds_needed(0.0, 7.7)


def _cfg(method: str, precision: str, sweep: str = "s", seed: int = 0) -> dict:
    return {"sweep": sweep, "method": {"name": method}, "rollout": {"precision": precision}, "task": {"name": "chain"},
            "model": {"name": "tiny"}, "seed": seed, "variant": ""}


def test_the_plan_is_for_the_family_the_report_corrects(tmp_path):
    """power.tests defaulted to 1 while the report Holm-corrects the comparisons with naive (5 in the quickstart):
    its "80 % power" was 35 % there. The family is the sweep's own unless power.tests says another."""
    from bench.launch.power import naive_family

    arms = ["bf16", "naive", "tis", "acr_uaq", "ess", "ais", "geo_rs"]
    quick = [_cfg(m, "bf16" if m == "bf16" else "mxfp4", seed=s) for m in arms for s in range(4)]
    assert naive_family(quick) == 5
    rungs = [_cfg(m, "bf16" if m == "bf16" else "mxfp4", sweep=f"slice/{r}") for r in ("a", "b", "c")
             for m in ("bf16", "naive", "tis", "geo_rs", "seq_is_rs")]
    assert naive_family(rungs) == 9
    assert naive_family([_cfg("tis", "int8"), _cfg("naive", "fp8_e4m3")]) == 0  # no naive at int8: no comparison
    cfg = OmegaConf.create({"power": PowerConfig(effect_pp=5.0, paired_sd_pp=5.39)})
    line = power_lines(cfg, 4, tmp_path, family=5)[0][0]
    assert f"{seeds_needed(5.0, 5.39, tests=5)} seeds give 80 % power" in line
    assert "alpha 0.05 / 5 (Holm's first step, the sweep's 5 comparisons with naive)" in line
    fixed = OmegaConf.create({"power": PowerConfig(effect_pp=5.0, paired_sd_pp=5.39, tests=1, alpha=0.01)})
    lines = power_lines(fixed, 4, tmp_path, family=5)[0]
    assert "Holm" not in lines[0] and any(x.startswith("WARNING: power.alpha=0.01 plans a test the report does not")
                                          for x in lines)
