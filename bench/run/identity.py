"""Run identity, defined once for the runner (bench) and the analysis (analysis/), which imports it without torch.

A run is identified by its `RunId`: (sweep, method, precision, task, model, variant, seed). An *arm* is a
method at a rollout precision, spelled `<method>@<precision>` everywhere (run path, run name, W&B job type,
tables). Everything else follows from the RunId here:

    run path   <out_root>/<sweep>/<method>@<precision>/<task>/<model>[/<variant>]/seed<k>/
    run name   <method>@<precision>-<task>-<model>[-<variant>]-s<seed>   (W&B name, progress bars, logs)
    W&B        group = sweep, job_type = arm, tags = the identity axes (`method:tis`, `precision:int8`, ...)
    files      config.yaml run.json metrics.jsonl eval.jsonl ckpt/last.pt
    statuses   running completed failed diverged preempted incomplete
    metrics    <namespace>/<name>, one vocabulary for metrics.jsonl, W&B, plots and tables

`variant` is empty for almost every run. A sweep whose jobs would otherwise share a run directory (they agree on
every identity axis but differ in another setting, e.g. `-m train.lr=1e-4,3e-4`) gets one variant level per job,
made of the settings they differ in (`train.lr=3e-4`): bench.launch.sweeper assigns it, `--dry-run` shows it.

The identity does not hold every setting, so a run directory also records a hash of its *semantic* config
(`config_hash`: the resolved config without NON_SEMANTIC_KEYS, the settings that do not change results). A launch
whose config differs from the one its directory was made with is refused, naming the keys (bench.run.resume).
A key added to the configuration after a run was recorded is no difference when the launch gives it its neutral
value, the one under which today's code computes what the code before the key computed (`ADDED_KEYS`).

Hydra's own run directory (conf/config.yaml) is computed by `RunId.path` through the `qrl_run_dir` resolver.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple

# ------------------------------------------------------------------------------------------------ layout
CONFIG_FILE = "config.yaml"
INFO_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
CKPT_DIR = "ckpt"
SEED_DIR = re.compile(r"seed(\d+)")
ARM_SEP = "@"
#: the identity axes besides the sweep, in path order: W&B tags and the analysis's grouping use the same names
AXES = ("method", "precision", "task", "model", "variant", "seed")
#: config key of each axis (`variant` is a top-level key set by the sweeper, empty for a plain run)
AXIS_KEYS = {"method": "method.name", "precision": "rollout.precision", "task": "task.name", "model": "model.name",
             "variant": "variant", "seed": "seed"}
ENGINE_KEY = "rollout.engine"  # the rollout engine of a run (RunId.engine)

#: Settings that do not change a run's numbers: left out of `config_hash`, so changing them never makes a run
#: directory refuse a relaunch. Dotted prefixes: `tracking` covers every `tracking.*` key.
NON_SEMANTIC_KEYS = (
    "sweep", "out_root", "variant",          # where the run lives, not what it computes
    "tracking",                              # W&B mode, project, entity
    "train.threads",                         # torch threads: same numbers up to float summation order
    "train.nproc_per_node",                  # processes of one run: a resume may change it (docs/scaling.md)
    "train.overwrite", "train.resume_from",  # what a launch does with an existing directory
    "train.checkpoint_every",                # how often state is saved (a resume recomputes identically)
    "train.keep_checkpoint",                 # whether ckpt/ stays after completion
    "budget",                                # the dry run's GPU-hours estimate
    "power",                                 # the dry run's seed count
    "model.cache_dir",                       # where the warm start is cached
)


#: The method every gap is measured against (a report's `--baseline`) and the uncorrected low-precision method whose
#: gap to it the corrections recover (`--naive`): analysis/arms.py and the dry run's seed planner read them here.
BASELINE = "bf16"
NAIVE = "naive"


class Arm(NamedTuple):
    """An arm: a method (`method.name`, e.g. tis) at a rollout precision; the same method at two precisions is two
    arms. Its one spelling is `<method>@<precision>` (`str(arm)`); a method alone is a method, never an arm. A
    tuple, so it equals and hashes as `(method, precision)`: the analysis keys its tables and figures by it."""

    method: str
    precision: str

    def __str__(self) -> str:
        return f"{self.method}{ARM_SEP}{self.precision}"

    @classmethod
    def parse(cls, text: str) -> "Arm":
        """The arm a `<method>@<precision>` spelling names (a run path's arm level)."""
        method, sep, precision = str(text).partition(ARM_SEP)
        if not sep or not method or not precision:
            raise ValueError(f"{text!r} is not an arm (<method>{ARM_SEP}<precision>)")
        return cls(method, precision)


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) or hasattr(node, "get") else getattr(node, part)
        if node is None:
            return None
    return node


#: the config keys whose values become folders of the run path, with what each is; `sweep` may nest (a/b)
PATH_KEYS = {"sweep": "the sweep's folder below out_root (<out_root>/<sweep>/...; it may nest: a/b)",
             "method.name": "the arm's folder (<method>@<precision>)", "rollout.precision": "the arm's folder",
             "task.name": "the task's folder", "model.name": "the model's folder",
             "variant": "the variant's folder"}


def path_error(key: str, value: Any) -> str | None:
    """Why `value` of config key `key` (one of PATH_KEYS) cannot be a part of a run path below out_root, or None.

    A run path must stay below out_root, whatever a value says (`sweep=../escape` wrote a run beside the results,
    `sweep=/x` would write to /x): each value is a plain folder name, no separator, not `.` or `..`, nothing
    absolute, no control character; only `sweep` may nest, as a relative path of such names (`severity/int4`)."""
    text = str(value)
    if key == "variant" and text == "":
        return None  # no variant: no level
    parts = text.split("/") if key == "sweep" else [text]
    bad = [p for p in parts if p in ("", ".", "..")]
    if text.startswith("/"):
        why = "it is absolute"
    elif bad:
        why = ("it is empty" if not text else "it holds an empty part" if not bad[0]
               else f"it {'holds' if key == 'sweep' else 'is'} {bad[0]!r}")
    elif "/" in text and key != "sweep":
        why = "it holds a '/'"
    elif "\\" in text:
        why = "it holds a '\\'"
    elif not text.isprintable():
        why = "it holds a control character"
    else:
        return None
    hint = "a relative path of plain names, e.g. sweep=mine or sweep=ladder/int4" if key == "sweep" else "a plain name"
    shown = text if text.isprintable() else repr(text)
    return f"{key}={shown}: {why}, but it becomes {PATH_KEYS[key]} and a run path must stay below out_root; use {hint}"


def check_path_parts(cfg: Any) -> None:
    """Raise ValueError (bench.launch.config's checks, before any work) for the first PATH_KEYS value of `cfg` that
    `path_error` refuses."""
    for key in PATH_KEYS:
        error = path_error(key, _get(cfg, key) or "")
        if error:
            raise ValueError(error)


@dataclass(frozen=True)
class RunId:
    """Who a run is: its path, its name, its W&B tags and its rows in every table follow from these fields."""

    sweep: str
    method: str
    precision: str
    task: str
    model: str
    seed: int
    variant: str = ""
    #: the rollout engine (`rollout.engine`): a W&B tag, not a path level (an arm's runs on two engines differ in
    #: their config hash, so one directory never holds both: a relaunch on the other engine is refused)
    engine: str = ""

    def __post_init__(self) -> None:
        """A RunId whose path would leave out_root cannot be made (check_path_parts says it before any work)."""
        for key, value in [("sweep", self.sweep)] + [(k, getattr(self, a)) for a, k in AXIS_KEYS.items() if a != "seed"]:
            error = path_error(key, value)
            if error:
                raise ValueError(error)

    @classmethod
    def of(cls, cfg: Any) -> "RunId":
        """The identity of a composed config (a DictConfig or the nested dict of a config.yaml)."""
        values = {axis: _get(cfg, key) for axis, key in AXIS_KEYS.items()}
        return cls(sweep=str(_get(cfg, "sweep")), method=str(values["method"]), precision=str(values["precision"]),
                   task=str(values["task"]), model=str(values["model"]), seed=int(values["seed"]),
                   variant=str(values["variant"] or ""), engine=str(_get(cfg, ENGINE_KEY) or ""))

    @property
    def arm(self) -> Arm:
        return Arm(self.method, self.precision)

    def path(self, out_root: str | Path) -> Path:
        """The run directory: a pure function of the identity, so a relaunched sweep finds its runs."""
        parts = [str(self.sweep), str(self.arm), self.task, self.model] + ([self.variant] if self.variant else [])
        return Path(out_root).joinpath(*parts, f"seed{int(self.seed)}")

    @property
    def subdir(self) -> str:
        """The run directory below the sweep directory (Hydra's `hydra.sweep.subdir`)."""
        return str(self.path("").relative_to(str(self.sweep)))

    @property
    def name(self) -> str:
        return "-".join([str(self.arm), self.task, self.model] + ([self.variant] if self.variant else []) + [f"s{self.seed}"])

    @property
    def tags(self) -> list[str]:
        """W&B tags: one `<axis>:<value>` per identity axis (the variant only when there is one), and the engine."""
        return [f"{a}:{getattr(self, a)}" for a in AXES if a != "variant" or self.variant] + (
            [f"engine:{self.engine}"] if self.engine else [])


def run_path(out_root: str | Path, sweep: str, method: str, precision: str, task: str, model: str, seed: int,
             variant: str = "") -> Path:
    """RunId(...).path(out_root), for Hydra's resolver (conf/config.yaml) which passes the fields one by one."""
    return RunId(str(sweep), str(method), str(precision), str(task), str(model), int(seed), str(variant or "")).path(out_root)


def run_subdir(*fields: Any) -> str:
    """Hydra's `hydra.sweep.subdir`: the run path below `<out_root>/<sweep>`."""
    sweep, method, precision, task, model, seed, *variant = fields
    return RunId(str(sweep), str(method), str(precision), str(task), str(model), int(seed),
                 str(variant[0] if variant and variant[0] else "")).subdir


def parse_run_path(path: Path) -> dict[str, Any]:
    """{method, precision, task, model, variant, seed} from a run directory's path, or {} if it is not one.

    From the end: `seed<k>`, an optional variant level (it always holds `=`), model, task, `<method>@<precision>`.
    """
    parts = list(Path(path).parts)
    m = SEED_DIR.fullmatch(parts[-1]) if parts else None
    if m is None:
        return {}
    parts.pop()
    variant = parts.pop() if parts and "=" in parts[-1] else ""
    if len(parts) < 3 or ARM_SEP not in parts[-3]:
        return {}
    method, precision = Arm.parse(parts[-3])
    return {"method": method, "precision": precision, "task": parts[-2], "model": parts[-1], "variant": variant,
            "seed": int(m.group(1))}


# ----------------------------------------------------------------------------------------- config identity
def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value} of a nested dict (lists are leaves)."""
    if not isinstance(tree, Mapping):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.update(flatten(v, key) if isinstance(v, Mapping) else {key: v})
    return out


def is_semantic(key: str) -> bool:
    """False for a key of NON_SEMANTIC_KEYS (or below one of them)."""
    return not any(key == k or key.startswith(k + ".") for k in NON_SEMANTIC_KEYS)


def semantic_config(resolved: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened resolved config without the keys that do not change results (`hydra` is never in it)."""
    return {k: v for k, v in flatten(resolved).items() if is_semantic(k) and not k.startswith("hydra.")}


def config_hash(resolved: Mapping[str, Any]) -> str:
    """A short stable hash of `semantic_config(resolved)`: equal for two configs that compute the same run."""
    text = json.dumps(semantic_config(resolved), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AddedKey:
    """A semantic key added to the configuration after runs were recorded without it."""

    neutral: Any  # the value under which today's code computes what the code before the key computed
    commit: str   # the commit that added the key (`git log -S`)
    why: str      # why that value reproduces the earlier code (tests/unit/test_added_keys.py shows it)


#: The keys added after runs existed, each with its neutral value. A run's recorded config that lacks one of these
#: keys matches a launch that gives it its neutral value (`config_diff`); any other value, or a missing key not
#: declared here, is a change and refuses the relaunch. A key belongs here only with a test that today's code at
#: the neutral value computes what the code before the key computed (tests/unit/test_added_keys.py), and only a
#: value for which that holds by construction counts: a schema default that changed the numbers is not neutral.
ADDED_KEYS: dict[str, AddedKey] = {
    "algo.baseline": AddedKey("all", "dd028ce", "every response of a group sets its GRPO mean and std (no `keep`), "
                                                "as before the key"),
    "method.denominator": AddedKey("all", "dd028ce", "a dropped token stays in the token-mean denominator with "
                                                     "weight 0, as before the key"),
    "method.geo_rs_weighted": AddedKey(False, "dd028ce", "geo_rs weights a kept sequence's tokens by 1, as before"),
    "method.is_seq_ratio": AddedKey("product", "dd028ce", "sequence-level TIS sums the log-ratios, as before; only "
                                                          "is_level=sequence reads it"),
    "eval.top_k": AddedKey(0, "3bd2052", "no top-k truncation: the sampler skips it, as before"),
    "convention": AddedKey("ours", "f1d2bb8", "no framework preset: the arm's knobs are its own config's; a "
                                              "preset would change method.* keys, which are compared themselves"),
    "rollout.compile": AddedKey(False, "4a105a2", "the eager decoder, the only one before"),
    "rollout.compact": AddedKey(False, "4a105a2", "finished rows stay in the batch, as before; true is not "
                                                  "neutral: fewer rows per decode GEMM match the full batch only "
                                                  "where the CPU kernel sums in the same order (measured, not by "
                                                  "construction)"),
    "rollout.sync_every": AddedKey(16, "4a105a2", "without compaction the stop check's interval changes no token "
                                                  "(stopped rows decode on masked, each token's uniform is drawn "
                                                  "before the loop, steps past the longest row are dropped)"),
    "rollout.fp8_kernel": AddedKey("auto", "73ca238", "every FP8 linear chooses its kernel with auto, the FP8 "
                                                      "format's default when the engine passed no kernel"),
    "rollout.refill": AddedKey(False, "846b144", "a batch larger than a chunk decodes a chunk at a time, each in its "
                                             "own cache, as before the key"),
    "rollout.cuda_graphs": AddedKey(False, "8b391be", "every decode step runs eagerly, the only way before the key"),
    "train.lr_warmup_steps": AddedKey(0, "bbf8aba", "train.lr from step 0, as before the key (bench.train.scheduled_lr)"),
    "rollout.cpu_kernels": AddedKey("plain", "2acf8e1", "every fp32 GEMM is torch's F.linear and every attention "
                                                    "SDPA, the only kernels before the key; auto is not neutral: "
                                                    "oneDNN and the matmul attention sum in another order"),
    "rollout.cpu_attention": AddedKey("matmul", "c5d2a48", "a CPU decode step attends by the two batched matmuls over "
                                                       "the live window, the only way before the key"),
}
UNSET = "<unset>"  # how config_diff shows a key one config lacks


def _same(a: Any, b: Any) -> bool:
    """Equal as recorded (JSON), so that True is not 1 and 0 is not False."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def is_neutral_absence(key: str, a: Any, b: Any) -> bool:
    """True when one side lacks `key` and the other gives it its declared neutral value (ADDED_KEYS)."""
    added = ADDED_KEYS.get(key)
    return added is not None and ((a == UNSET and _same(b, added.neutral)) or (b == UNSET and _same(a, added.neutral)))


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, old value, new value) for every semantic key whose value differs (a missing key reads `<unset>`); a key
    of ADDED_KEYS that one side lacks and the other sets to its neutral value does not differ."""
    a, b = semantic_config(old), semantic_config(new)
    diff = [(k, a.get(k, UNSET), b.get(k, UNSET)) for k in sorted(set(a) | set(b))]
    return [(k, x, y) for k, x, y in diff if x != y and not is_neutral_absence(k, x, y)]


#: keys that choose a component: when one differs, the keys the two components do not share differ with it
CHOOSERS = ("engine", "name")


def describe_diff(diff: Iterable[tuple[str, Any, Any]], limit: int = 6) -> str:
    """`key: old -> new; ...`, the values both records set first (a changed `rollout.engine` is named, not hidden
    in "and 8 more" behind the keys only one engine has); a key one side lacks says why: the other component's
    key where its chooser changed, else whether ADDED_KEYS declares it (and its neutral value)."""
    diff = sorted(diff, key=lambda d: (UNSET in d[1:], d[0].rsplit(".", 1)[-1] not in CHOOSERS, d[0]))
    switched = {k.rsplit(".", 1)[0]: k for k, a, b in diff if k.rsplit(".", 1)[-1] in CHOOSERS and UNSET not in (a, b)}

    def one(k: str, a: Any, b: Any) -> str:
        text = f"{k}: {a!r} -> {b!r}"
        if UNSET not in (a, b):
            return text
        if k.rsplit(".", 1)[0] in switched:
            return text + f" (only one of the two {switched[k.rsplit('.', 1)[0]]} values has this key)"
        added = ADDED_KEYS.get(k)
        if added is None:
            return text + " (a key one record lacks and bench.run.identity.ADDED_KEYS does not declare)"
        return text + f" (added in {added.commit}; only {k}={json.dumps(added.neutral)} computes as before it)"

    shown = "; ".join(one(*d) for d in diff[:limit])
    return shown + (f"; and {len(diff) - limit} more" if len(diff) > limit else "")


# ---------------------------------------------------------------------------------------------- statuses
#: Every state a run.json can hold. A diverged run is a result (an arm that collapses is a finding), so
#: analysis keeps it; running / failed / preempted runs have no final result. `incomplete`: trained to the
#: end, but steps are missing from metrics.jsonl that no checkpoint could recompute (unreadable lines, set
#: aside in metrics.jsonl.bad-<time>); analysis leaves it out, `train.overwrite=true` reruns it.
STATUSES = ("running", "completed", "failed", "diverged", "preempted", "incomplete")
FINISHED_STATUSES = ("completed", "diverged")

# ----------------------------------------------------------------------------------------------- metrics
#: The metric namespaces of a metrics.jsonl / eval.jsonl row (besides "step"):
#:   reward/*   the rollout batch's rewards          train/*     loss, grad norm, entropy, clipfrac, lr
#:   mismatch/* pi_old vs mu (bench/mismatch.py)     method/<arm>/*  each arm's own diagnostics
#:   quant/*    QuRL weight-update / quant error     time/*      wall-clock seconds and throughput
#:   eval/*     greedy test evaluation (eval/accuracy); eval sets: eval/<set>/<metric> (pass@k, avg@k, ...)
#:   final/*    run.json summary of a completed run
#:   critic/*   PPO's value model (algo.advantage=gae)  sampling/*  DAPO dynamic sampling / overlong counts
#: The rows are written by bench/train.py (`step_metrics`, `evaluate`), mirrored as they are to W&B
#: (bench/run/tracking.py) and read by analysis/; the keys of each namespace are written where they are computed.


def method_metric(method: str, key: str) -> str:
    """The name of an arm's own diagnostic, `method/<arm>/<key>`: the trainer writes it, the analysis reads it."""
    return f"method/{method}/{key}"


# ----------------------------------------------------------------------------------------------- reading
@dataclass
class JsonlRead:
    """The readable rows of a JSONL file, and the lines that were not (line number, text)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[tuple[int, str]] = field(default_factory=list)
    n_lines: int = 0
    linenos: list[int] = field(default_factory=list)  # the line number of each row

    @property
    def torn_tail_only(self) -> bool:
        """True when the only unreadable line is the last one: what a writer killed mid-line leaves."""
        return len(self.bad) == 1 and self.bad[0][0] == self.n_lines


def read_jsonl(path: Path) -> JsonlRead:
    """Every line of `path` that is a JSON object, in order; the others are reported, never silently lost.

    A missing file reads as empty. Bytes that are not UTF-8 make that line unreadable, not the file.
    """
    out = JsonlRead()
    path = Path(path)
    if not path.exists():
        return out
    lines = [ln for ln in path.read_bytes().split(b"\n")]
    if lines and lines[-1] == b"":
        lines.pop()
    out.n_lines = len(lines)
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError):
            out.bad.append((lineno, raw.decode("utf-8", errors="replace")[:200]))
            continue
        out.rows.append(obj)
        out.linenos.append(lineno)
    return out
