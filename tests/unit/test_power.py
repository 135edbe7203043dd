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
    assert prior_paired_sd(tmp_path / "report")[0] == pytest.approx(5.0)  # paired.csv wins; final accuracy only
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
