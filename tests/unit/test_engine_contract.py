"""Every registered rollout engine has every member of the RolloutEngine protocol (bench/rollout/base.py), with
the protocol's parameters: a new engine is checked here without editing a list.

Engines whose package is missing here (vLLM on a machine without it) are checked from their class and the
`self.<name> = ...` assignments of their source, without building one.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from bench.rollout import build_engine
from bench.rollout.base import RolloutEngine
from bench.registry import ENGINES

METHODS = sorted(n for n, v in vars(RolloutEngine).items() if callable(v) or isinstance(v, classmethod)
                 if not n.startswith("_"))
ATTRIBUTES = sorted(RolloutEngine.__annotations__)


def test_the_protocol_states_what_the_code_reads():
    assert set(METHODS) == {"load_weights", "quant_metrics", "generate", "release"}
    assert set(ATTRIBUTES) == {"precision", "eos_id", "pad_id", "max_len", "sampling_device"}


def assigned_attributes(cls: type) -> set[str]:
    """Names the class sets on its instances (`self.x = ...`, tuples too) or defines in its body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set(vars(cls))
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values() if p.name not in ("self", "cls")]


@pytest.mark.parametrize("name", ENGINES.names())
def test_registered_engine_has_the_protocol(name):
    cls = ENGINES.get(name)
    missing = [m for m in METHODS + ATTRIBUTES if m not in assigned_attributes(cls)]
    assert missing == [], f"engine {name!r} ({cls.__name__}) lacks {missing}"
    # built by build_engine from its schema's keys: the precision and every knob, then eos_id, pad_id and max_len
    made = inspect.signature(cls).parameters
    takes_knobs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in made.values())
    knobs = [f.name for f in dataclasses.fields(ENGINES.schema(name)) if f.name not in ("engine", "temperature")]
    assert [k for k in ("precision", "eos_id", "pad_id", "max_len") if k not in made] == []
    assert takes_knobs or [k for k in knobs if k not in made] == [], f"{cls.__name__} does not take {knobs}"
    for method in METHODS:
        want = params(getattr(RolloutEngine, method))
        got = params(getattr(cls, method))
        assert got[:len(want)] == want, f"{cls.__name__}.{method}{got} does not take {want}"


@pytest.mark.parametrize("name", ENGINES.names())
def test_registered_engine_built_from_its_config_is_an_engine(name):
    schema = ENGINES.schema(name)
    try:
        engine = build_engine(schema(engine=name, precision="fp32"), eos_id=2, pad_id=0, max_len=64)
    except ImportError as e:  # an optional engine whose package is not installed here
        pytest.skip(f"{name}: {e}")
    assert isinstance(engine, RolloutEngine)
    assert (engine.eos_id, engine.pad_id, engine.max_len, engine.precision) == (2, 0, 64, "fp32")


def test_a_class_missing_a_member_fails_the_check():
    class NoMaxLen:
        precision, eos_id, pad_id, sampling_device = "bf16", 2, 0, None

        def __init__(self):
            self.other = 1

    assert "max_len" not in assigned_attributes(NoMaxLen)
    assert not isinstance(NoMaxLen(), RolloutEngine)
