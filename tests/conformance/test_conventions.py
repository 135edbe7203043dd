"""Convention switches (docs/arms.md §8): `convention=<framework>` gives the arm that framework's defaults, from
conf/convention_preset/<arm>_<framework>.yaml, each value citing the file and commit it was read at.

Golden cases: one batch, theta = theta_old, token-mean, and the gradient dL/dltheta each framework's code gives on it
(the numbers were worked out by hand from each framework's formula as read at its commit, independently of
bench/, and are literals here). The batch puts each framework's rule on a different side of its band:

    row  A    p_old                 p_mu                    rho = p_old/p_mu          what differs
    0    +1   [0.8, 0.5, 0.3]       [0.8/e^1.7, 0.5, 0.3]   [5.47, 1, 1]              TIS caps 1.2 / 2 / 3 / 5; max k3 2.77
    1    -1   [0.4, 0.4, 0.4]       [0.5, 0.5, 0.5]         [0.8, 0.8, 0.8]           product 0.512 vs geometric 0.8
    2    +1   [0.42, 0.21, 0.6]     [0.40, 0.20, 0.6]       [1.05, 1.05, 1]           product 1.1025, g 1.033
    3    -1   [5e-5, 0.7, 0.9]      [1.0, 0.7, 0.9]         [5e-5, 1, 1]              a veto token; p_old - p_mu = -1

A preset without a golden case here fails (`test_every_preset_has_a_golden_case`), so a new framework's values are
tested when they are added.
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from bench.launch.config import CONF_DIR, arm_conventions, check_convention
from bench.methods.base import Batch, make_method
from tests.helpers import make_cfg

D = torch.float64
PRESETS = sorted(p.stem for p in (CONF_DIR / "convention_preset").glob("*.yaml"))
FRAMEWORKS = ("verl", "trl", "skyrl", "areal", "roll", "prime", "miles")

P_OLD = [[0.8, 0.5, 0.3], [0.4, 0.4, 0.4], [0.42, 0.21, 0.6], [5e-5, 0.7, 0.9]]
P_MU = [[0.8 / math.exp(1.7), 0.5, 0.3], [0.5, 0.5, 0.5], [0.40, 0.20, 0.6], [1.0, 0.7, 0.9]]
ADV = [1.0, -1.0, 1.0, -1.0]

GOLDEN = {
    "dppo_tv_prime": [[0.000283, -0.083333, -0.083333], [0.066629, 0.066629, 0.066629], [-0.087492, -0.087492, -0.083333], [-0.001651, 0.083333, 0.083333]],
    "dppo_tv_skyrl": [[0.000000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000000, 0.083333, 0.083333]],
    "dppo_tv_verl": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333]],
    "geo_rs_areal": [[-0.146865, -0.146865, -0.146865], [0.066667, 0.066667, 0.066667], [-0.086088, -0.086088, -0.086088], [0.003070, 0.003070, 0.003070]],
    "geo_rs_miles": [[-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000], [-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000]],
    "geo_rs_roll": [[-0.000000, -0.000000, -0.000000], [0.166667, 0.166667, 0.166667], [-0.166667, -0.166667, -0.166667], [0.000000, 0.000000, 0.000000]],
    "geo_rs_skyrl": [[-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000], [-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000]],
    "geo_rs_verl": [[-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000], [-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000]],
    "icepop_areal": [[-0.000000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "icepop_miles": [[-0.000000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "icepop_roll": [[-0.000000, -0.100000, -0.100000], [0.100000, 0.100000, 0.100000], [-0.100000, -0.100000, -0.100000], [0.000000, 0.100000, 0.100000]],
    "icepop_trl": [[-0.000000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "icepop_verl": [[-0.000000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000000, 0.083333, 0.083333]],
    "k3_rs_areal": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333]],
    "k3_rs_verl": [[-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000], [-0.333333, -0.333333, -0.333333], [0.000000, 0.000000, 0.000000]],
    "m2po_areal": [[-0.000000, -0.100000, -0.100000], [0.100000, 0.100000, 0.100000], [-0.100000, -0.100000, -0.100000], [0.000000, 0.100000, 0.100000]],
    "opsm_miles": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333]],
    "opsm_trl": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
    "prob_diff_roll": [[-0.000000, -0.100000, -0.100000], [0.100000, 0.100000, 0.100000], [-0.100000, -0.100000, -0.100000], [0.000000, 0.100000, 0.100000]],
    "prob_diff_seq_roll": [[-0.000000, -0.000000, -0.000000], [0.166667, 0.166667, 0.166667], [-0.166667, -0.166667, -0.166667], [0.000000, 0.000000, 0.000000]],
    "seq_is_rs_areal": [[-0.146865, -0.146865, -0.146865], [0.066667, 0.066667, 0.066667], [-0.086088, -0.086088, -0.086088], [0.003070, 0.003070, 0.003070]],
    "seq_is_rs_miles": [[-0.000000, -0.000000, -0.000000], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
    "seq_is_rs_roll": [[-0.000000, -0.000000, -0.000000], [0.000000, 0.000000, 0.000000], [-0.333333, -0.333333, -0.333333], [0.000000, 0.000000, 0.000000]],
    "seq_is_rs_skyrl": [[-0.000000, -0.000000, -0.000000], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
    "seq_is_rs_trl": [[-0.000000, -0.000000, -0.000000], [0.042667, 0.042667, 0.042667], [-0.091875, -0.091875, -0.091875], [0.000004, 0.000004, 0.000004]],
    "seq_is_rs_verl": [[-0.000000, -0.000000, -0.000000], [0.085333, 0.085333, 0.085333], [-0.183750, -0.183750, -0.183750], [0.000000, 0.000000, 0.000000]],
    "tis_areal": [[-0.416667, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "tis_miles": [[-0.166667, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "tis_roll": [[-0.100000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "tis_skyrl": [[-0.166667, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "tis_trl": [[-0.250000, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "tis_verl": [[-0.166667, -0.083333, -0.083333], [0.066667, 0.066667, 0.066667], [-0.087500, -0.087500, -0.083333], [0.000004, 0.083333, 0.083333]],
    "trm_k2_areal": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
    "trm_k2_verl": [[-0.111111, -0.111111, -0.111111], [0.111111, 0.111111, 0.111111], [-0.111111, -0.111111, -0.111111], [0.000000, 0.000000, 0.000000]],
    "trm_k3_areal": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
    "trm_k3_verl": [[-0.000000, -0.000000, -0.000000], [0.166667, 0.166667, 0.166667], [-0.166667, -0.166667, -0.166667], [0.000000, 0.000000, 0.000000]],
    "veto_miles": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
    "veto_skyrl": [[-0.083333, -0.083333, -0.083333], [0.083333, 0.083333, 0.083333], [-0.083333, -0.083333, -0.083333], [0.000000, 0.000000, 0.000000]],
}

# CISPO weights clip(pi_theta / pi_old): one response, A = +1, pi_theta / pi_old = [0.85, 1.15, 1.5, 6.0]
CISPO_RATIO = [0.85, 1.15, 1.5, 6.0]
CISPO_GOLDEN = {  # dL/dltheta = -w * A / 4
    "cispo_verl": [-0.85 / 4, -1.15 / 4, -1.2 / 4, -1.2 / 4],   # clip_ratio 0.2 / 0.2: [0.8, 1.2]
    "cispo_skyrl": [-0.85 / 4, -1.15 / 4, -1.5 / 4, -5.0 / 4],  # [1 - 1.0, 1 + 4.0]
    "cispo_roll": [-0.9 / 4, -1.1 / 4, -1.1 / 4, -1.1 / 4],     # cispo_epsilon 0.1 / 0.1: [0.9, 1.1]
}


def preset(name: str) -> tuple[str, dict]:
    methods = sorted({p.rsplit("_", 1)[0] for p in PRESETS}, key=len, reverse=True)
    method = next(a for a in methods if name.startswith(a + "_"))
    return method, OmegaConf.to_container(OmegaConf.load(CONF_DIR / "convention_preset" / f"{name}.yaml"))


def grad_of(method: str, values: dict, lold: torch.Tensor, lmu: torch.Tensor, lt: torch.Tensor, adv: list[float]):
    m = make_method(method, **values)
    mask = torch.ones_like(lold, dtype=torch.bool)
    b = Batch(lold if m.needs_recompute else None, lmu, torch.tensor(adv, dtype=D), mask, float(mask.sum()))
    lt = lt.clone().requires_grad_(True)
    loss, _ = m.loss(lt, b, m.prepare(b))
    loss.backward()
    return lt.grad


def test_every_preset_has_a_golden_case():
    assert set(PRESETS) == set(GOLDEN) | set(CISPO_GOLDEN)
    for name in PRESETS:
        assert name.rsplit("_", 1)[1] in FRAMEWORKS, name
        text = (CONF_DIR / "convention_preset" / f"{name}.yaml").read_text()
        assert text.startswith("# @package method\n") and "@" in text.splitlines()[1] + text.splitlines()[2]  # a commit


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_gradient(name):
    method, values = preset(name)
    lold, lmu = torch.log(torch.tensor(P_OLD, dtype=D)), torch.log(torch.tensor(P_MU, dtype=D))
    torch.testing.assert_close(grad_of(method, values, lold, lmu, lold, ADV), torch.tensor(GOLDEN[name], dtype=D),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", sorted(CISPO_GOLDEN))
def test_golden_cispo(name):
    method, values = preset(name)
    lold = torch.log(torch.tensor([[0.3, 0.4, 0.2, 0.1]], dtype=D))
    lt = lold + torch.log(torch.tensor([CISPO_RATIO], dtype=D))
    torch.testing.assert_close(grad_of(method, values, lold, lold - 0.1, lt, [1.0]),
                               torch.tensor([CISPO_GOLDEN[name]], dtype=D), atol=1e-9, rtol=0)


def test_skyrl_veto_has_an_upper_edge():
    """SkyRL's suggested outlier_token_is_threshold_high = 100 drops a response holding rho = 150; miles has none."""
    lold = torch.log(torch.tensor([[0.75, 0.5], [0.5, 0.5]], dtype=D))
    lmu = lold - torch.tensor([[math.log(150.0), 0.0], [0.0, 0.0]], dtype=D)
    g_sky = grad_of("veto", preset("veto_skyrl")[1], lold, lmu, lold, [1.0, 1.0])
    g_miles = grad_of("veto", preset("veto_miles")[1], lold, lmu, lold, [1.0, 1.0])
    torch.testing.assert_close(g_sky, torch.tensor([[0.0, 0.0], [-0.25, -0.25]], dtype=D))
    torch.testing.assert_close(g_miles, torch.full((2, 2), -0.25, dtype=D))


def test_verl_dppo_caps_the_ratio_weight_prime_does_not():
    """Once theta moved (pi_theta / pi_old = 4 on an A > 0 token whose probability rose by < 0.2): verl's weight is
    min(4, clip_ratio_c = 3), prime-rl's (against mu = pi_old here) is 4 plus its KL term 2 * 1e-3 * log 4."""
    lold = torch.log(torch.tensor([[0.01, 0.5]], dtype=D))
    lt = lold + torch.log(torch.tensor([[4.0, 1.0]], dtype=D))
    g_verl = grad_of("dppo_tv", preset("dppo_tv_verl")[1], lold, lold, lt, [1.0])
    g_prime = grad_of("dppo_tv", preset("dppo_tv_prime")[1], lold, lold, lt, [1.0])
    torch.testing.assert_close(g_verl, torch.tensor([[-3.0 / 2, -1.0 / 2]], dtype=D))
    torch.testing.assert_close(g_prime, torch.tensor([[(-4.0 + 2e-3 * math.log(4.0)) / 2, -1.0 / 2]], dtype=D))


def test_the_switch_composes_and_an_explicit_value_wins(tmp_path):
    cfg = make_cfg(tmp_path, "method=seq_is_rs", "convention=trl")
    assert cfg.convention == "trl" and cfg.method.is_cap_C == 3.0 and cfg.method.is_cap_low is None
    cfg = make_cfg(tmp_path, "method=seq_is_rs", "convention=trl", "method.is_cap_C=2.5")
    assert cfg.method.is_cap_C == 2.5 and cfg.method.is_cap_low is None
    assert make_cfg(tmp_path, "method=tis").convention == "ours"


def test_a_framework_without_a_counterpart_is_refused(tmp_path):
    assert arm_conventions("cispo") == ["ours", "roll", "skyrl", "verl"]
    with pytest.raises(ValueError, match=r"convention=trl: trl has no counterpart of method=cispo .*conventions for "
                                         r"cispo: ours, roll, skyrl, verl"):
        check_convention(make_cfg(tmp_path, "method=cispo", "convention=trl"))
    check_convention(make_cfg(tmp_path, "method=cispo", "convention=verl"))
