"""Every numeric key of every registered schema declares its domain (bench/domains.py), and the pre-work check
enforces it: {nan, inf, -inf, -1, 0, 1e30} through each key is either refused with one message naming the key,
the value and the allowed range, or accepted because the declared domain documents that value.

The keys come from the registries and the sections of bench.launch.config, so a key added to any schema is covered
without editing this file, and a numeric key added without a domain fails `test_every_numeric_key_declares_a_domain`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from bench.launch.config import GROUP_REGISTRIES, Config, _check_part, check_across, check_root_domains, checks
from bench.domains import Domain, domains, num, numeric_kind
from bench.eval_config import EvalConfig
from bench.algo_config import AlgoConfig
from bench.launch.budget import BudgetConfig
from bench.models.config import ModelConfig
from bench.run.tracking import TrackingConfig
from bench.train_config import TrainConfig
from tests.unit.test_configs import compose_cfg, extra_overrides

BAD_VALUES = ("nan", "inf", "-inf", "-1", "0", "1e30")
FIXED_SECTIONS = {"algo": AlgoConfig, "train": TrainConfig, "eval": EvalConfig, "budget": BudgetConfig,
                  "model": ModelConfig, "tracking": TrackingConfig}


def every_schema() -> list[tuple[str, str | None, type]]:
    """(section, group option or None, schema) for every registered schema and every fixed section."""
    out = [(group, entry.name, entry.schema) for group, registry in GROUP_REGISTRIES.items()
           for entry in registry.entries()]
    return out + [(section, None, schema) for section, schema in FIXED_SECTIONS.items()]


def numeric_keys(schema: type) -> list[str]:
    return [f.name for f in dataclasses.fields(schema) if numeric_kind(schema, f.name) is not None]


def test_every_numeric_key_declares_a_domain():
    missing, optional_unexplained = [], []
    for section, option, schema in [*every_schema(), ("root", None, Config)]:
        doms = domains(schema)
        for key in numeric_keys(schema):
            where = f"{section}{f'={option}' if option else ''}: {key}"
            if key not in doms:
                missing.append(where)
                continue
            field = {f.name: f for f in dataclasses.fields(schema)}[key]
            if field.default is None and not doms[key].admits(None):
                optional_unexplained.append(where)
    assert not missing, f"numeric keys without a declared domain (bench/domains.py num(...)): {missing}"
    assert not optional_unexplained, f"keys defaulting to null whose domain does not say what null means: {optional_unexplained}"
    # and every default is inside its own domain
    for section, option, schema in [*every_schema(), ("root", None, Config)]:
        obj_defaults = {f.name: f.default for f in dataclasses.fields(schema)}
        for key, dom in domains(schema).items():
            default = obj_defaults[key]
            if isinstance(default, (int, float)) or default is None:
                assert dom.admits(default), f"{section}.{key}: default {default} outside its domain {dom.describe()}"


def _override_value(text: str):
    """The value Hydra's override grammar gives `key=<text>` (what the command line would merge)."""
    return OverridesParser.create().parse_override(f"k={text}").value()


@pytest.mark.parametrize("section, option, schema", every_schema(), ids=lambda x: x if isinstance(x, str) else None)
def test_bad_values_are_refused_or_documented(section, option, schema, tmp_path: Path, domain_tally):
    overrides = [f"{section}={option}"] if option else []
    if option:
        overrides += extra_overrides(section, option, tmp_path)
    base = compose_cfg(overrides)
    baseline = _first_error(base, section, schema)  # e.g. rollout=vllm without vLLM installed: its own refusal
    dom = domains(schema)
    for key in numeric_keys(schema):
        kind = numeric_kind(schema, key)
        cfg, original = base, base[section][key]
        for text in BAD_VALUES:
            OmegaConf.update(cfg, f"{section}.{key}", original, merge=True)  # each value on the composed default
            value = _override_value(text)
            try:
                OmegaConf.update(cfg, f"{section}.{key}", value, merge=True)
            except ValidationError as e:  # a float where an int is declared: Hydra refuses it at composition
                assert kind is int and isinstance(value, float), (section, key, text, e)
                domain_tally["refused_by_type"] += 1
                continue
            stored = cfg[section][key]
            error = _first_error(cfg, section, schema)
            if dom[key].admits(stored):
                # an acceptance the schema documents; a relation between keys may still refuse it, naming the key
                assert error == baseline or error is not None and error.startswith(f"{section}.{key}="), \
                    (section, key, text, error)
                domain_tally["documented_accepted" if error == baseline else "refused_by_relation"] += 1
            else:
                assert error is not None and error.startswith(f"{section}.{key}="), (section, key, text, error)
                assert "is out of range; allowed: " + dom[key].interval() in error, error
                assert "\n" not in error
                domain_tally["refused_by_domain"] += 1
        OmegaConf.update(cfg, f"{section}.{key}", original, merge=True)


def _first_error(cfg, section: str, schema: type) -> str | None:
    """The first refusal of the pre-work checks that read this section (its domains and check(), then the checks
    across sections), as bench.launch.config.checks runs them."""
    for check in (lambda: _check_part(cfg, section, schema), lambda: check_across(cfg)):
        try:
            check()
        except ValueError as e:
            return str(e)
    return None


@pytest.fixture(scope="module")
def domain_tally():
    from collections import Counter

    tally: Counter = Counter()
    yield tally
    print(f"\n[domains] {dict(tally)}")


def test_the_root_seed_is_checked():
    cfg = compose_cfg(["seed=-1"])
    with pytest.raises(ValueError, match=r"^seed=-1 is out of range; allowed: \[0, inf\) integer$"):
        check_root_domains(cfg)
    assert checks(cfg)  # the root check is one of the pre-work checks
    with pytest.raises(ValueError, match="seed=-1"):
        for check in checks(cfg):
            check()


@pytest.mark.parametrize("interval, inside, outside", [
    ("(0, 1]", [1e-300, 0.5, 1.0], [0.0, -1.0, 1.0000001, math.inf, math.nan, None]),
    ("[1, inf)", [1, 10**12], [0, -1, math.inf, math.nan]),
    ("(0, inf]", [1e-9, math.inf], [0.0, -math.inf, math.nan]),
    ("[0, 0]", [0, 0.0], [1e-12, -1e-12]),
])
def test_interval_membership(interval, inside, outside):
    dom = Domain.parse(interval)
    assert all(dom.admits(v) for v in inside), interval
    assert not any(dom.admits(v) for v in outside), interval


def test_special_values_and_descriptions():
    dom = Domain.parse("[1, 1024]", {0: "leave torch's default", None: "the whole batch"})
    assert dom.admits(0) and dom.admits(None) and dom.admits(3)
    assert not dom.admits(-1) and not dom.admits(False) and not dom.admits(2000)
    assert dom.describe(integer=True) == "[1, 1024] integer; 0 = leave torch's default; null = the whole batch"
    with pytest.raises(ValueError, match="write an interval"):
        Domain.parse("0..1")
    with pytest.raises(ValueError, match="must not exceed"):
        Domain.parse("[2, 1]")


def test_a_subclass_that_changes_a_default_keeps_the_domain():
    @dataclasses.dataclass
    class Base:
        n: int = num(3, "[1, 9]")

    @dataclasses.dataclass
    class Child(Base):
        n: int = 5

    assert domains(Child)["n"] is domains(Base)["n"]


def test_the_configuration_page_lists_every_domain():
    """docs/configuration.md holds bench.launch.config.domain_table() verbatim: a key, an option or a range changed in
    code and not on the page fails here (`python -m bench.launch.config` rewrites the block between the markers)."""
    from bench.launch.config import DOMAINS_PAGE, domain_table

    page = DOMAINS_PAGE.read_text()
    block = page.split("<!-- domains:begin", 1)[1].split("-->", 1)[1].split("<!-- domains:end -->", 1)[0]
    assert block.strip() == domain_table().strip(), "run `python -m bench.launch.config` and commit the page"


def test_the_table_is_rewritten_in_place_between_its_markers(tmp_path):
    from bench.launch.config import DOMAINS_PAGE, domain_table, write_domain_table

    page = tmp_path / "configuration.md"
    stale = DOMAINS_PAGE.read_text().replace("| `seed` | all | int | [0, inf) |\n", "")
    page.write_text(stale)
    assert write_domain_table(page) is True
    assert page.read_text() == DOMAINS_PAGE.read_text() and domain_table() in page.read_text()
    assert write_domain_table(page) is False
