"""Command-line overrides checked before Hydra runs them: one line naming the value and what is valid, exit 2.

Hydra reports an unknown choice (`method=bogus`), a key the schema does not have (`train.stepz=3`) or a value of
the wrong type (`seed=abc`) in a 10-20 line listing with its config search path, and exits 1. `check_overrides`
composes the config first, the way Hydra will, and turns such an error into the suite's one line (bench.launch.cli),
with "did you mean" when a valid name is close (difflib):

    task=arithmetc: unknown task 'arithmetc' (did you mean 'arithmetic'?); valid choices: aime24, ...
    train.stepz=3: train has no key 'stepz' (did you mean 'steps'?); its keys: batch_size, ...
    seed=abc: 'abc' is not a valid seed (Value 'abc' of type 'str' could not be converted to Integer)

A sweep (-m) is checked job by job: the overrides that are not swept first (their errors name them), then every
job the sweep will launch, expanded as its sweeper expands it (bench/launch/sweeper.py `expand`: the Cartesian
product, a recipe's rows, each fixed-precision arm once at its own precision). So `-m method=naive,tis
rollout.precision=int8,fp8_e4m3` checks the four jobs it runs, never a combination it does not contain.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any, Callable, Iterator

#: Hydra's submitit launchers, and ours that wrap them (bench/launch/launchers.py)
HYDRA_SUBMITIT = {"submitit_slurm": "slurm", "submitit_local": "local"}
#: config groups whose name has a slash (conf/hydra/<group>/): `hydra.launcher=slurm` is this one misspelt
NESTED_GROUPS = ("hydra/launcher", "hydra/sweeper")
#: Hydra flags that take a value or change what runs: with any of them, Hydra parses the command line itself
HYDRA_FLAGS = ("-m", "--multirun")
#: why a sweep refuses train.overwrite=true (bench/run/resume.py: it deletes a run's results, completed ones too)
SWEEP_OVERWRITE = ("train.overwrite=true is refused on a sweep (-m): it would delete and retrain every completed "
                   "run of the sweep; a relaunch of the sweep already resumes or restarts the unfinished ones. To "
                   "redo one run, launch it alone (no -m) with train.overwrite=true")
_MISSING = re.compile(r"Could not find '(?P<path>[^']+)'")
_NOT_IN_DEFAULTS = re.compile(r"Could not override '(?P<group>[^']+)'\. No match in the defaults list")
#: an error inside a yaml of conf/ as Hydra composes it: the file (conf/-relative, no suffix) and the key
_IN_YAML = re.compile(r"In '(?P<file>[^']+)': (?P<kind>\w+) raised while composing config:\n(?P<detail>[^\n]*)"
                      r"(?:.*?full_key: (?P<key>\S+))?", re.S)
#: the prefix of the groups bench.launch.config registers each component's schema under (`_schema/method/tis`)
_SCHEMA_GROUP = "_schema/"


#: Hydra's flags that print the composed config instead of running it (`--cfg job`): its overrides are checked
#: all the same (a typo gave Hydra's 7-line error and exit 1), the flags' own values (job, hydra, all; a package)
#: taken out first
PRINTING_FLAGS = ("--cfg", "-c", "--package", "-p", "--resolve")
_VALUED = ("--cfg", "-c", "--package", "-p")


def without_printing_flags(args: list[str]) -> list[str]:
    """`args` with the values of PRINTING_FLAGS that take one dropped (the flags stay, to be seen)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        out.append(a)
        skip = a in _VALUED
    return out


def check_overrides(args: list[str], check: Callable[[Any], str | None] | None = None) -> str | None:
    """The one-line error for the first override Hydra cannot compose, or None (see the module docstring);
    `check(cfg)` (bench.launch.entry: the value checks) is asked about each composed config too."""
    import yaml

    try:
        return _first_error(args, check)
    except yaml.MarkedYAMLError as e:  # a yaml of conf/ that does not parse: Hydra lets the parser's error through
        mark = e.context_mark or e.problem_mark  # where the construct began (a problem may be at the end)
        where = f"{_shown_path(mark.name)}, line {mark.line + 1}" if mark is not None else "a yaml of conf/"
        return f"{where}: not valid YAML: {' '.join(filter(None, (e.context, e.problem)))}"


def _shown_path(name: str) -> str:
    """A file below the repository as its relative path (conf/method/tis.yaml), any other as given."""
    from bench.launch.config import CONF_DIR

    path = Path(name)
    return str(path.relative_to(CONF_DIR.parent)) if path.is_relative_to(CONF_DIR.parent) else name


def _first_error(args: list[str], check: Callable[[Any], str | None] | None) -> str | None:
    """check_overrides, once the yaml files parse."""
    args = without_printing_flags(args)
    flags = [a for a in args if a.startswith("-")]
    if any(f not in HYDRA_FLAGS + ("--dry-run", "--preflight", *PRINTING_FLAGS) for f in flags):
        return None  # --config-name, --info, ...: Hydra's own command line
    overrides = [a for a in args if not a.startswith("-")]
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from bench.launch.config import CONF_DIR

    multirun = bool(set(flags) & set(HYDRA_FLAGS))
    # a dry run (or a printed config) writes nothing: a read-only copy of the results may be listed
    writes = "--dry-run" not in flags and not set(flags) & set(PRINTING_FLAGS)
    try:
        _parse(overrides)
    except ValueError as e:
        return str(e)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        trials, fixed, base = [overrides], overrides, None
        if multirun:
            sweep = _sweep(overrides, compose, writes)
            if isinstance(sweep, str):
                return sweep
            trials, fixed, base = sweep
        configs = []
        for trial, cfg in _composed(trials, compose):
            if isinstance(cfg, HydraException):
                return explain(cfg, trial, compose)
            if multirun and cfg.train.get("overwrite"):  # any spelling of true, from the command line or a yaml
                return SWEEP_OVERWRITE
            error = (check(cfg) if check is not None else None) or (writes and unwritable_run_dir(cfg))
            if error:
                swept = [o for o in trial if o not in fixed]
                return f"{error} (in the sweep's job {' '.join(swept)})" if swept else error
            configs.append(cfg)
        if multirun:  # the request against the jobs (GPUs per node against their ranks), as the launcher checks it
            from bench.launch.requests import slurm_request_error

            return slurm_request_error(base.hydra.launcher, configs)
    return None


def _sweep(overrides: list[str], compose: Callable[..., Any], writes: bool
           ) -> tuple[list[list[str]], list[str], Any] | str:
    """A sweep's jobs (each one's overrides), its fixed overrides and its composed base config, or the one-line
    error of the first part that fails: the base, the sweep directory, the launcher's keys and request, the
    expansion into jobs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from bench.launch.requests import slurm_request_error
    from bench.launch.sweeper import expand

    parser = OverridesParser.create()
    fixed = [o for o in overrides if not parser.parse_override(o).is_sweep_override()]
    try:
        base = compose("config", overrides=fixed, return_hydra_config=True)
    except HydraException as e:
        return explain(e, fixed, compose)
    error = writes and unwritable_dir("sweep directory", Path(str(base.hydra.sweep.dir)))  # multirun.yaml
    if error:
        return error
    if error := added_launcher_key(fixed, compose, base):
        return error
    if error := slurm_request_error(base.hydra.launcher):  # what the SLURM launcher would refuse
        return error
    try:
        trials, _ = expand(overrides, compose, base)
    except HydraException as e:  # a swept value that does not compose: named by the job that holds it
        return explain(e, overrides, compose)
    except Exception as e:  # noqa: BLE001 -- a sweep Hydra's sweeper cannot expand (range() in a list)
        swept = [o for o in overrides if o not in fixed]
        return f"{' '.join(swept)}: this sweep cannot be expanded into jobs ({_first_line(e)})"
    return trials, fixed, base


def _composed(jobs: list[list[str]], compose: Callable[..., Any]) -> Iterator[tuple[list[str], Any]]:
    """(job, its composed config, or the HydraException composing it raised) for every job, in order.

    Composing is what a check of a sweep costs (~0.1 s a job; Hydra composes each job again before launching it),
    and most sweeps repeat each job over seeds: jobs that differ only in `seed=<int>` are composed once and the
    seed is set on a copy. Any other difference, and a seed that is not a plain integer, is composed in full."""
    from hydra.errors import HydraException
    from omegaconf import open_dict

    done: dict[tuple[str, ...], Any] = {}
    for job in jobs:
        seeds = [o for o in job if o.startswith("seed=") and o[5:].isdigit()]
        key = tuple(o for o in job if o not in seeds)
        if seeds and key in done:
            cfg = copy.deepcopy(done[key])
            with open_dict(cfg):
                cfg.seed = int(seeds[-1][5:])
            yield job, cfg
            continue
        try:
            cfg = compose("config", overrides=job, return_hydra_config=True)
        except HydraException as e:
            yield job, e
            continue
        if seeds:
            done[key] = cfg
        yield job, cfg


def unwritable_run_dir(cfg: Any) -> str | None:
    """The error when a new run's directory cannot be made, or None: Hydra makes it (as it writes a sweep's
    multirun.yaml) before any of the suite's code runs, and fails in a 30-line traceback. A run directory that
    exists already is the run's to judge (a completed run in a read-only copy of the results is skipped)."""
    from bench.run.identity import RunId

    try:
        run_dir = RunId.of(cfg).path(Path(str(cfg.out_root)).expanduser().absolute())
    except ValueError as e:  # a value that cannot be a folder of the run path (bench/run/identity.py)
        return str(e)
    return None if run_dir.exists() else unwritable_dir("run directory", run_dir)


def unwritable_dir(what: str, path: Path) -> str | None:
    from bench.run.store import unwritable

    why = unwritable(path)
    return f"{what} {path} cannot be written ({why}); make it writable, or choose another out_root=DIR" if why else None


def _parse(overrides: list[str]) -> None:
    """Raise ValueError naming the first argument that is no override at all."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in overrides:
        try:
            parser.parse_override(arg)
        except HydraException as e:
            raise ValueError(f"{arg}: not a valid override ({_first_line(e)}); write key=value, group=option "
                             "or +key=value") from None
        key, _, value = arg.lstrip("+~").partition("=")
        if key == "hydra/launcher" and value in HYDRA_SUBMITIT:  # Hydra's own, without our snapshot and checks
            raise ValueError(f"{arg} is Hydra's own launcher, without the suite's code snapshot, request checks and "
                             f"progress line; use hydra/launcher={HYDRA_SUBMITIT[value]}")
        group = key.replace(".", "/")
        if "." in key and group in NESTED_GROUPS:  # `hydra.launcher=slurm`: a group chosen with a dot
            options = group_options(group)
            listing = f"; valid choices: {', '.join(options)}" if options else ""
            raise ValueError(f"{arg}: {group} is a config group, chosen with a slash: {group}={value}{listing}")


def explain(err: Exception, overrides: list[str], compose: Any) -> str:
    """Hydra's composition error as one line naming the override, the valid choices or keys, and a close match."""
    from hydra.errors import MissingConfigException

    not_in_defaults = _NOT_IN_DEFAULTS.search(str(err))
    if not_in_defaults:  # `experiment=smoke`: a group the defaults list does not pick needs `+` to be added
        group = not_in_defaults["group"]
        arg = next((a for a in overrides if a.split("=", 1)[0] == group), group)
        value = arg.split("=", 1)[1] if "=" in arg else "..."
        options = group_options(group)
        listing = f"; valid choices: {', '.join(options)}" if options else ""
        return f"{arg}: {group} is not chosen by default, so it is added with a '+': +{group}={value}{listing}"
    if isinstance(err, MissingConfigException):
        found = _MISSING.search(str(err))
        path = found["path"] if found else ""
        group, _, value = path.rpartition("/")
        options = [str(o) for o in (getattr(err, "options", None) or [])]
        keyed = [(a, a.lstrip("+~").split("=", 1)[0]) for a in overrides]
        if group.startswith(_SCHEMA_GROUP):  # conf/<group>/<value>.yaml exists; no component is registered so
            group = group.removeprefix(_SCHEMA_GROUP)
            arg = next((a for a, k in keyed if k == group), f"{group}={value}")
            return (f"{arg}: conf/{group}/{value}.yaml has no {group} registered under its name"
                    f"{_did_you_mean(value, options)}; the name a component registers (bench/registry.py) must be "
                    f"its yaml's file name. Registered: {', '.join(options)}")
        top = group.split("/", 1)[0]
        if "/" in group and group not in {k for _, k in keyed} and group_options(top):  # a nested option
            options, value, group = group_options(top), path.split("/", 1)[1], top  # (experiment=paper/x), not a
        # nested group (hydra/launcher=x); Hydra lists a folder's own files, not its subfolders'
        options = sorted(set(options) | set(group_options(group)))
        given = [a for a, k in keyed if k == group]  # the override naming `value` (else the last: it wins)
        arg = next((a for a in given if a.split("=", 1)[1] == value), given[-1] if given else f"{group}={value}")
        if options:
            return f"{arg}: unknown {group} {value!r}{_did_you_mean(value, options)}; valid choices: {', '.join(options)}"
        return f"{arg}: no config {path!r} ({_first_line(err)})"
    in_yaml = _IN_YAML.search(str(err))
    if in_yaml:  # a yaml of conf/ itself is wrong, not the command line
        return _yaml_error(in_yaml)
    cause = err.__cause__
    full_key = getattr(cause, "full_key", None) or ""
    keyed = [(a, a.lstrip("+~").split("=", 1)[0]) for a in overrides]
    # the override of the failing key, or of a key under it (`trian.steps=3`: the parent 'trian' does not exist)
    arg = _quoted([a for a, k in keyed if full_key and (k == full_key or k.startswith(full_key + "."))], err)
    if arg is None:  # an error inside the value of a dict override: the override whose key is a prefix
        arg = _quoted([a for a, k in keyed if full_key.startswith(k + ".")], err)
        if arg is not None:
            return f"{arg}: {_first_line(err)}" + (f" ({_first_line(cause)})" if cause is not None else "")
    if arg is not None and type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):  # no such key
        parent, _, key = full_key.rpartition(".")
        keys = _keys_of(parent, [a for a in overrides if a != arg], compose)
        listing = f"; its keys: {', '.join(keys)}" if keys else ""
        return f"{arg}: {parent or 'the config'} has no key {key!r}{_did_you_mean(key, keys)}{listing}"
    if arg is not None and cause is not None and "is not Optional" in str(cause):  # `rollout.precision=null`
        choices = _choices_of(full_key, [a for a in overrides if a != arg], compose)
        return f"{arg}: {full_key} needs a value, not null" + (f"; valid choices: {choices}" if choices else "")
    if arg is not None and cause is not None:
        value = arg.split("=", 1)[1] if "=" in arg else ""
        return f"{arg}: {value!r} is not a valid {full_key} ({_first_line(cause)})"
    return f"{' '.join(overrides)}: {_first_line(err)}" + (f" ({_first_line(cause)})" if cause is not None else "")


def _yaml_error(found: re.Match) -> str:
    """A yaml under conf/ that fails to compose, named with its key: a stated option name (`name:`, which the file
    name sets), a key its schema does not have (with a close match), or Hydra's own first line."""
    where, key, detail = f"conf/{found['file']}.yaml", found["key"] or "", found["detail"].strip()
    if found["kind"] == "ReadonlyConfigError" and key:
        return (f"{where}: sets {key}, which is the option's name and is set from the file name; remove "
                f"'{key.rpartition('.')[2]}:' from the yaml")
    if found["kind"] in ("ConfigKeyError", "ConfigAttributeError") and key:
        from bench.launch.config import GROUP_REGISTRIES

        parent, _, name = key.rpartition(".")
        group, _, option = found["file"].partition("/")
        registry = GROUP_REGISTRIES.get(group)
        keys = []
        if registry is not None and parent == group and option in registry:
            keys = sorted(f.name for f in dataclasses.fields(registry.schema(option)) if f.name != "name")
        listing = f"; its keys: {', '.join(keys)}" if keys else ""
        return f"{where}: {parent or 'the config'} has no key {name!r}{_did_you_mean(name, keys)}{listing}"
    return f"{where}: {detail}" + (f" ({key})" if key else "")


def added_launcher_key(overrides: list[str], compose: Callable[..., Any], base: Any) -> str | None:
    """A key added to the launcher (`+hydra.launcher.partiton=gpu`) that it does not have: Hydra composes it, and
    submitit refuses it at submission in a 26-line traceback. None when every added key is the launcher's own."""
    added = [a for a in overrides if a.startswith("+hydra.launcher.") and "=" in a]
    if not added:
        return None
    plain = compose("config", overrides=[a for a in overrides if a not in added], return_hydra_config=True)
    keys = sorted(str(k) for k in plain.hydra.launcher.keys() if not str(k).startswith("_"))
    for arg in added:
        key = arg.split("=", 1)[0].removeprefix("+hydra.launcher.").split(".")[0]
        if key not in keys:
            return f"{arg.split('=', 1)[0]}: hydra.launcher has no key {key!r}{_did_you_mean(key, keys)}; its keys: " \
                   f"{', '.join(keys)}"
    return None


def _quoted(candidates: list[str], err: BaseException) -> str | None:
    """Of the overrides an error may be about, the last whose value the error quotes, else the last (a key given
    twice: Hydra applies both in order, and the error is the bad value's)."""
    text = f"{err} {err.__cause__}"
    quoted = [a for a in candidates if "=" in a and f"'{a.split('=', 1)[1]}'" in text]
    return (quoted or candidates or [None])[-1]


def group_options(group: str) -> list[str]:
    """Every option of config group `group`, nested ones as `folder/name` (conf/<group>/**/*.yaml)."""
    from bench import CONF_DIR

    folder = CONF_DIR / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml")) if folder.is_dir() else []


def _keys_of(parent: str, overrides: list[str], compose: Any) -> list[str]:
    """The keys of config node `parent` (dotted; '' = the root) once the other overrides are applied."""
    try:  # hydra.launcher's keys are in the Hydra config, which a plain compose leaves out
        node: Any = compose("config", overrides=overrides, return_hydra_config=parent.split(".")[0] == "hydra")
        for part in [p for p in parent.split(".") if p]:
            node = node[part]
        return sorted(str(k) for k in node.keys() if not str(k).startswith("_"))  # not a launcher's _target_
    except Exception:  # noqa: BLE001 -- the listing is a courtesy; the error line stands without it
        return []


def _choices_of(key: str, overrides: list[str], compose: Any) -> str:
    """The valid choices of a string key, as its schema's check lists them ('' where it lists none): the key is
    set to a value no choice has and the config's checks are run (the choices are written once, in the checks)."""
    from omegaconf import OmegaConf

    from bench.launch.config import validate

    try:
        cfg: Any = compose("config", overrides=overrides)
        OmegaConf.update(cfg, key, "__null__", force_add=False)  # a plain name: the path check passes it
        validate(cfg)
    except ValueError as e:
        listed = str(e).partition("choose one of: ")[2]
        return listed.splitlines()[0] if listed else ""
    except Exception:  # noqa: BLE001 -- the listing is a courtesy; the error line stands without it
        return ""
    return ""


def _did_you_mean(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__
