"""Import the suite's modules without torch and transformers, to check a command line in a fraction of a second.

The schemas of the arms and the engines live beside the code they configure, in modules that import torch and
transformers; the registries import those modules when a name is first looked up, and checking a config looks up
every chosen name: ~10 s of CPU before a typo could be reported. `stubbed()` puts stand-ins for those
packages in front of the import system (Sphinx autodoc's `autodoc_mock_imports` does the same to document code
whose dependencies are absent), so that the modules import in well under a second and Hydra can compose and
`bench.launch.config.validate` can check the config.

A stand-in only has to survive module level code (`import torch.nn.functional as F`, `class X(nn.Module)`,
`@torch.no_grad()`, `DTYPES = {"bf16": torch.bfloat16}`). Once the modules are imported, `strict()` makes any use
of a stand-in raise `NeedsTorch`: a check that would ask torch something (is CUDA usable?) is then left to the
real run instead of being answered by a stand-in.

Used only in a forked child process (bench.launch.quickcheck): the stand-ins never reach the process that runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Iterator

#: the packages replaced (their submodules too): the slow imports of the trainer
STUBBED = ("torch", "transformers", "vllm", "safetensors", "tokenizers", "accelerate", "datasets", "wandb")


class NeedsTorch(BaseException):
    """A check used a stand-in after import: only the real packages can answer it (a BaseException, so that no
    `except Exception` in a check turns it into an answer)."""


_STRICT = False


def _strict_guard(what: str) -> None:
    if _STRICT:
        raise NeedsTorch(what)


class _StubMeta(type):
    """The stand-ins are classes, so that code can subclass them, call them and take their attributes."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _strict_guard(f"{cls.__qualname__}.{name}")
        return _stub(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls.__dict__.get("_is_stub"):
            _strict_guard(f"{cls.__qualname__}()")
            if len(args) == 1 and callable(args[0]) and not kwargs:  # used as a decorator: keep the function
                return args[0]
            return _stub(f"{cls.__qualname__}()")
        return super().__call__(*args, **kwargs)  # a subclass defined by the code: a normal class

    def __bool__(cls) -> bool:
        _strict_guard(f"bool({cls.__qualname__})")
        return True

    def __iter__(cls) -> Iterator[Any]:
        _strict_guard(f"iter({cls.__qualname__})")
        return iter(())

    def __or__(cls, other: Any) -> Any:  # `torch.Tensor | None` in an evaluated annotation
        return cls

    __ror__ = __or__

    def __getitem__(cls, item: Any) -> Any:  # `Callable[...]`-like generics written with a stub
        return cls

    def __mro_entries__(cls, bases: tuple) -> tuple:
        return (cls,)


def _stub(name: str) -> type:
    return _StubMeta(name, (), {"_is_stub": True, "__module__": name.split(".")[0]})


class _StubModule(ModuleType):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package: `import torch.nn.functional` finds its submodules here too
        self.__version__ = "0"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        _strict_guard(f"{self.__name__}.{name}")
        return _stub(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return _StubModule(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass


@contextmanager
def stubbed() -> Iterator[None]:
    """Within: the STUBBED packages import as stand-ins (they must not have been imported for real already)."""
    real = [m for m in sys.modules if m.split(".")[0] in STUBBED]
    if real:
        raise RuntimeError(f"cannot stub packages already imported: {', '.join(sorted(real)[:5])}")
    finder = _Finder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def strict() -> None:
    """From now on, any use of a stand-in raises NeedsTorch (after the modules are imported)."""
    global _STRICT
    _STRICT = True
