"""The one registration mechanism of the suite: methods, tasks, rollout engines, precisions, reward scorers,
answer formats and advantage estimators.

Each extension point owns one `Registry`, keyed by the name the user types (`method=tis`, `task=countdown`,
`rollout=vllm`, `rollout.precision=int8`), which is also the name in the run path, the metric namespace and
the plots. A component registers itself where it is defined:

    @METHODS.register("tis", schema=TISConfig)
    class TIS(Method): ...

and the registry finds every component by importing all modules of its package the first time a name is
looked up (lm-evaluation-harness's `@register_model`, without its hand-kept MODEL_MAPPING). So adding an arm
is its module plus its yaml, and nothing else: no import list, tuple or if/else on names to keep in sync.

A `schema` is the dataclass of the component's own config keys (lingua's `OptimArgs` beside `optim.py`);
`bench.launch.config.register_configs` hands every registered schema to Hydra's ConfigStore.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered name: the component, its config schema, and what it declares about itself for
    reports (e.g. an arm's plot colour and table order), recorded in each run's run.json."""

    name: str
    obj: T
    schema: type | None
    meta: dict[str, Any]


class RegistryError(ValueError):
    """A name registered by two components: every command refuses to start until one is renamed."""


class Registry(Generic[T]):
    """name -> component for one extension point; `package` is where its components live."""

    def __init__(self, kind: str, package: str, name_attr: str | None = None) -> None:
        self.kind = kind
        self.package = package
        self.name_attr = name_attr  # a class attribute the registry sets to the key (the class never states it)
        self._entries: dict[str, Entry[T]] = {}
        self._discovered = False

    def register(self, name: str, *, schema: type | None = None, **meta: Any) -> Callable[[T], T]:
        """Decorator: make `obj` selectable as `name` (stack it to register one class under several names)."""

        def deco(obj: T) -> T:
            old = self._entries.get(name)
            if old is not None and _qualname(old.obj) != _qualname(obj):
                raise RegistryError(f"{self.kind} {name!r} is registered twice: {_qualname(old.obj)} and "
                                    f"{_qualname(obj)}; give one of them another name")
            self._entries[name] = Entry(name, obj, schema, dict(meta))
            if self.name_attr and isinstance(obj, type) and self.name_attr not in vars(obj):
                setattr(obj, self.name_attr, name)
            return obj

        return deco

    def discover(self) -> None:
        """Import every module of the package once (or the one module, where `package` names a module), so that
        their `register` calls have run."""
        if self._discovered:
            return
        pkg = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
            importlib.import_module(f"{self.package}.{info.name}")
        self._discovered = True

    def names(self) -> list[str]:
        self.discover()
        return sorted(self._entries)

    def entry(self, name: str) -> Entry[T]:
        self.discover()
        if name not in self._entries:
            check_choice(self.kind, name, self.names())
        return self._entries[name]

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def schema(self, name: str) -> type:
        schema = self.entry(name).schema
        if schema is None:
            raise ValueError(f"{self.kind} {name!r} has no config schema")
        return schema

    def name_of_schema(self, schema: type) -> str:
        """The one name registered with exactly this schema class (a config built in code, without its name)."""
        self.discover()
        names = [e.name for e in self._entries.values() if e.schema is schema]
        if len(names) != 1:
            raise ValueError(f"no single {self.kind} has the schema {schema.__name__} (found {names or 'none'})")
        return names[0]

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._entries

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in self.names()]


def check_choice(what: str, value: object, valid: tuple | list) -> None:
    """The one check of a value against its valid choices: ValueError naming the bad value and listing the valid
    ones (registries, granularities, kernels, backends)."""
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(map(str, valid))}")


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


# The extension points, declared here rather than beside their components so that importing one (with the
# configuration module bench/launch/config.py, the schemas, the run directory) imports no torch: a registry's
# components, which do, are imported when a name is first looked up, as registering or checking a configuration
# does. The type of each is the component's, named in its comment.

#: `method=<arm>`: `Method` subclasses (bench/methods/)
METHODS: Registry[type] = Registry("method", "bench.methods")
#: `task=<name>`: `Task` subclasses (bench/tasks/)
TASKS: Registry[type] = Registry("task", "bench.tasks", name_attr="name")
#: `rollout=<engine>`: rollout engine classes (bench/rollout/)
ENGINES: Registry[Any] = Registry("rollout engine", "bench.rollout")
#: `rollout.precision=<name>`: number `Format` classes (bench/quant/)
FORMATS: Registry[type] = Registry("precision", "bench.quant")
#: `algo.advantage=<name>`: advantage estimator classes, built as `cls(algo, train, policy)` (bench/advantages.py)
ESTIMATORS: Registry[type] = Registry("advantage estimator", "bench.advantages")
#: `task.reward=<name>`: scorers (completion, gold) -> reward; each declares `answer_format` (the ANSWER_FORMATS
#: name its answers come in) and, where it has one-off work to keep out of the time limit, `setup` (bench/rewards.py)
SCORERS: Registry[Callable[[str, Any], float]] = Registry("reward scorer", "bench.rewards")
#: answer format name -> whether a completion has that format (the format reward's check; bench/rewards.py)
ANSWER_FORMATS: Registry[Callable[[str], bool]] = Registry("answer format", "bench.rewards")
#: every extension point (the quick check imports all their components before it answers: bench/launch/entry.py)
REGISTRIES = (METHODS, TASKS, ENGINES, FORMATS, ESTIMATORS, SCORERS, ANSWER_FORMATS)
