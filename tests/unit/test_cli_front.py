"""Issue 25 item 2: `qrl-bench --help` and every config error are answered before torch and transformers load
(bench/launch/entry.py): one line naming the value, its valid choices and a close match, exit 2.

Each case is the real command in a subprocess whose `torch` and `transformers` cannot be imported: a directory at
the front of PYTHONPATH holds packages of those names that raise ImportError, so a command that imported either,
in any of its processes, would fail with that error instead of its answer. (This replaced a bound on the
commands' CPU time: importing torch costs 2.5-3 s of CPU on a 2-core AVX2 machine, about what composing a paper
recipe's jobs costs, so no bound told the two apart; a check of what is imported holds on any machine.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hang import HANG_S

from tests.helpers import REPO

#: what a command answered before torch may not import: each raises ImportError naming itself
NEVER_IMPORTED = ("torch", "transformers")


@pytest.fixture(scope="session")
def unimportable(tmp_path_factory) -> str:
    """A PYTHONPATH entry whose `torch` and `transformers` raise ImportError on import."""
    root = tmp_path_factory.mktemp("unimportable")
    for name in NEVER_IMPORTED:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} was imported by a command answered "
                                                 f"before {name} (tests/unit/test_cli_front.py)')\n")
    return str(root)


def run_cli(*args: str, unimportable: str | None = None) -> subprocess.CompletedProcess:
    """`python -m bench ARGS`, offline; with `unimportable` (the fixture's path) torch and transformers cannot load."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_SILENT": "true",
           "WANDB_MODE": "offline"}
    if unimportable:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [unimportable, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=HANG_S)


def run_python(code: str) -> subprocess.CompletedProcess:
    """`python -c CODE` in the repository, in a fresh process (what it imports is its own)."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)


def test_help_shows_examples_and_groups_without_torch(unimportable):
    cp = run_cli("--help", unimportable=unimportable)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    for example in ("qrl-bench method=", "qrl-bench -m method=", "--dry-run", "-m +experiment=smoke_short",
                    "hydra/launcher=slurm", "qrl-analyze results/"):
        assert example in out, example
    groups = {line.split(":")[0] for line in out.splitlines() if ": " in line and line[0].isalpha()}
    assert {"method", "rollout", "task", "model", "tracking", "experiment"} <= groups
    assert "tis" in next(line for line in out.splitlines() if line.startswith("method:"))


def test_exit_codes_are_listed_without_torch(unimportable):
    cp = run_cli("--exit-codes", unimportable=unimportable)
    assert cp.returncode == 0 and "2    bad configuration" in cp.stdout and "128+N" in cp.stdout


@pytest.mark.parametrize("flag", ["--help", "--exit-codes"])
def test_a_page_read_by_a_closed_pipe_ends_quietly(flag):
    """`qrl-bench --help | head -1`: the reader has gone when the page is written (here: the pipe's read end is closed
    before the process starts, so every write fails); no BrokenPipeError traceback, exit 0."""
    read, write = os.pipe()
    os.close(read)
    try:
        cp = subprocess.run([sys.executable, "-m", "bench", flag], cwd=REPO, stdout=write, stderr=subprocess.PIPE,
                            text=True, timeout=HANG_S)
    finally:
        os.close(write)
    assert cp.returncode == 0 and cp.stderr == "", cp.stderr


@pytest.mark.parametrize("args, needles", [
    # an unknown group option: the choices and the close one
    (["method=tiss"], ["method=tiss: unknown method 'tiss'", "(did you mean 'tis'?)", "valid choices: acr, "]),
    # an unknown key: the keys of its section and the close one (not Hydra's "+train.stepz" advice)
    (["train.stepz=3"], ["train.stepz=3: train has no key 'stepz'", "(did you mean 'steps'?)", "its keys: batch_size"]),
    # a misspelt section: the root's keys and the close one (not Hydra's echo of every override)
    (["trian.steps=3"], ["trian.steps=3: the config has no key 'trian'", "(did you mean 'train'?)", "its keys: algo"]),
    (["-m", "trian.steps=1,2"], ["trian.steps=1: the config has no key 'trian'", "(did you mean 'train'?)"]),
    # a value of the wrong type
    (["seed=abc"], ["seed=abc: 'abc' is not a valid seed"]),
    # what the SLURM launcher would refuse of its request, before anything is submitted (it was exit 1, in Hydra's
    # wrapper, and --dry-run passed it)
    (["-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=1", "hydra.launcher.gres=gpu:1", "--dry-run"],
     ["hydra.launcher: GPUs requested twice"]),
    (["-m", "hydra/launcher=slurm", "hydra.launcher.signal_delay_s=3540", "--dry-run"],
     ["hydra.launcher.signal_delay_s=3540 comes before submitit counts", "timeout_min>=295"]),
    (["-m", "+experiment=paper/qurl_table2", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "--dry-run"],
     ["hydra.launcher asks for 4 GPU(s) per node, but a job runs 8 ranks per node", "gpus_per_node=8"]),
    # a loaded model without its path: the key to set
    (["model=hf"], ["model=hf loads a transformers model: give model.path=DIR_OR_HUB_ID"]),
    # a key given twice: the override whose value is bad is named, wherever it stands
    (["train.steps=2", "train.steps=abc"], ["train.steps=abc: 'abc' is not a valid train.steps"]),
    (["train.steps=abc", "train.steps=2"], ["train.steps=abc: 'abc' is not a valid train.steps"]),
    # a relation between a task's keys, checked by its schema before any work (the dry run too)
    (["task=chain", "task.min_steps=9", "task.max_steps=3", "--dry-run"],
     ["task.min_steps=9 must be <= task.max_steps=3"]),
    # a value out of range, and a choice a type cannot express (the schemas' check(), run before torch)
    (["train.lr=-1"], ["train.lr=-1 is out of range; allowed: (0, 1]"]),
    # the declared domains (bench/domains.py): values the schema's type admits but the key does not
    (["algo.adv_eps=inf"], ["algo.adv_eps=inf is out of range; allowed: [0, 1]"]),
    (["model.hidden_size=0"], ["model.hidden_size=0 is out of range; allowed: [1, inf) integer"]),
    (["train.threads=-1"], ["train.threads=-1 is out of range; allowed: [1, 1024] integer; 0 = leave torch's default"]),
    (["rollout.temperature=1e30"], ["rollout.temperature=1e30 is out of range; allowed: (0, 10]"]),
    (["method=tis", "method.is_cap_C=inf"], ["method.is_cap_C=inf is out of range; allowed: (0, inf)"]),
    (["method=naive", "rollout.precision=fp9"], ["rollout.precision='fp9' is not valid; choose one of: ", "fp8_e4m3"]),
    # null for a key that needs a value: its choices where its schema's check lists them (it said "not Optional")
    (["rollout.precision=null"], ["rollout.precision=null: rollout.precision needs a value, not null; valid choices: ",
                                  "fp8_e4m3"]),
    (["train.steps=null"], ["train.steps=null: train.steps needs a value, not null"]),
    # a sweep: each swept value is checked
    (["-m", "method=bf16,tiss"], ["method=tiss: unknown method 'tiss'", "(did you mean 'tis'?)"]),
    # a key added with '+' that no schema has: composed by Hydra, read by nothing (it would train the default job)
    (["-m", "+experimnt=smoke_short", "--dry-run"],
     ["+experimnt: the config has no key 'experimnt'", "+experiment=", "config groups (group=option): method, "]),
    (["+train.foo=1"], ["+train.foo: train has no key 'foo'", "Valid keys: batch_size"]),
    # a group that is not in the defaults needs its '+'; nested options (paper recipes) are listed and matched
    (["-m", "experiment=smoke_short"], ["added with a '+': +experiment=smoke_short", "paper/qurl_table1, "]),
    (["-m", "+experiment=paper/qurl_tabel1"], ["unknown experiment 'paper/qurl_tabel1'",
                                               "(did you mean 'paper/qurl_table1'?)", "smoke_short"]),
    (["-m", "+experiment=nope"], ["+experiment=nope: unknown experiment 'nope'", "paper/qurl_table1, ", "smoke_short"]),
    # a nested group (hydra/launcher) lists its own options, Hydra's included, and echoes what was typed
    (["-m", "method=bf16", "hydra/launcher=slrm", "--dry-run"],
     ["hydra/launcher=slrm: unknown hydra/launcher 'slrm'", "(did you mean 'slurm'?)", "valid choices: basic, local, "]),
    (["method=bf16", "method=tiss"], ["method=tiss: unknown method 'tiss'"]),  # the override that names it, not the first
    # the SLURM launcher's settings, before anything is submitted (a traceback, an sbatch error naming no setting, or
    # nothing: array_parallelism=0 was launched)
    (["-m", "method=bf16", "hydra.launcher=slurm", "--dry-run"],
     ["hydra.launcher=slurm: hydra/launcher is a config group, chosen with a slash: hydra/launcher=slurm",
      "valid choices: local, slurm"]),
    (["-m", "hydra/launcher=slurm", "hydra.launcher.partiton=gpu", "--dry-run"],
     ["hydra.launcher has no key 'partiton' (did you mean 'partition'?); its keys: account, "]),
    (["-m", "hydra/launcher=slurm", "+hydra.launcher.partiton=gpu", "--dry-run"],
     ["+hydra.launcher.partiton: hydra.launcher has no key 'partiton' (did you mean 'partition'?); its keys: "]),
    (["-m", "method=bf16", "hydra/launcher=submitit_slurm", "--dry-run"],
     ["hydra/launcher=submitit_slurm is Hydra's own launcher", "use hydra/launcher=slurm"]),
    (["-m", "hydra/launcher=slurm", "hydra.launcher.timeout_min=-5", "--dry-run"],
     ["hydra.launcher.timeout_min=-5 is not valid: a number >= 1"]),
    (["-m", "hydra/launcher=slurm", "hydra.launcher.preempt_signal=FOO", "--dry-run"],
     ["hydra.launcher.preempt_signal='FOO' is not a signal; use USR1"]),
    (["-m", "hydra/launcher=slurm", "hydra.launcher.array_parallelism=0", "--dry-run"],
     ["hydra.launcher.array_parallelism=0 is not valid: a whole number >= 1"]),
    # an engine a run of several ranks cannot use, before its GPUs are allocated (it was refused at run start)
    (["-m", "+experiment=paper/qurl_table3", "eval.engine=vllm", "--dry-run"],
     ["eval.engine=vllm with 8 processes evaluates in the rollout engine only", "(in the sweep's job method=naive"]),
    # a flag neither qrl-bench nor Hydra has: ours, not Hydra's usage screen
    (["--dryrun"], ["unknown option '--dryrun' (did you mean '--dry-run'?)"]),
    # a config printed with Hydra's --cfg is checked as a run's (it was Hydra's 7-line error, exit 1)
    (["--cfg", "job", "train.stpes=3"], ["train.stpes=3: train has no key 'stpes' (did you mean 'steps'?)"]),
    (["seed=-1"], ["seed=-1 is out of range; allowed: [0, inf) integer"]),
    # issue 32 F6: what is wrong with batch size 0 (it was "not divisible")
    (["train.batch_size=0"], ["train.batch_size=0 is out of range; allowed: [1, inf)"]),
    # issue 32 F1: a sweep's jobs are checked, not each swept value against the defaults: this job is in the sweep
    (["-m", "method=naive,tis", "rollout.precision=int8,fp9"], ["rollout.precision='fp9' is not valid",
                                                                "(in the sweep's job method=naive rollout.precision=fp9)"]),
    # issue 32 F6: any spelling of true reaches the sweep's overwrite guard
    (["-m", "method=bf16,tis", "train.overwrite=choice(false,true)"], ["train.overwrite=true is refused on a sweep"]),
])
def test_config_errors_are_one_line_exit_2_without_torch(args, needles, unimportable):
    cp = run_cli(*args, unimportable=unimportable)
    assert cp.returncode == 2, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1, cp.stderr
    assert lines[0].startswith("qrl-bench: error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_a_value_out_of_its_domain_writes_nothing(tmp_path, unimportable):
    """Refused before any work: no run directory, no warm start in the model cache (the built-in model's warm
    start is the first thing a run would otherwise build)."""
    cache, out = tmp_path / "cache", tmp_path / "results"
    env_args = [f"out_root={out}", f"model.cache_dir={cache}"]
    cp = run_cli("model.num_layers=-1", *env_args, unimportable=unimportable)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.strip().splitlines() == [
        "qrl-bench: error: model.num_layers=-1 is out of range; allowed: [1, inf) integer"]
    assert not out.exists() and not cache.exists()


def test_the_configuration_and_its_schemas_import_no_torch():
    """Issue 37: bench.launch.config (the composition root) and every schema it composes import neither torch nor
    the packages built on it; the components registered under those schemas (arms, engines) are imported when a
    name is first looked up, not before."""
    heavy = ("torch", "transformers", "vllm", "datasets", "wandb", "safetensors", "tokenizers")
    code = (
        "import sys\n"
        "import bench.launch.config, bench.registry, bench.algo_config, bench.train_config, bench.models.config\n"
        "import bench.eval_config, bench.methods\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))\n"
    )
    cp = run_python(code)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "[]"
    # the check: a registry's first lookup imports its components, and with them torch
    code = "import sys\nfrom bench.registry import METHODS\nMETHODS.names()\nprint('torch' in sys.modules)\n"
    cp = run_python(code)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "True"


def test_the_checker_imports_no_torch():
    """The check's child imports the suite with stand-ins (bench/launch/stubs.py); the real packages are never
    loaded there, and a check that needs them raises NeedsTorch instead of being answered by a stand-in."""
    code = (
        "import sys\n"
        "from bench.launch.stubs import NeedsTorch, strict, stubbed\n"
        "with stubbed():\n"
        "    import bench.launch.config, bench.launch.cli\n"
        "    import torch\n"
        "    assert not hasattr(torch, '__file__'), 'the real torch was imported'\n"
        "    strict()\n"
        "    try:\n"
        "        torch.cuda.is_available()\n"
        "    except NeedsTorch:\n"
        "        print('needs torch')\n"
    )
    cp = run_python(code)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == "needs torch"


@pytest.mark.parametrize("args, key", [
    (["sweep=../escape"], "sweep=../escape: it holds '..'"),
    (["sweep={tmp}/abs"], "it is absolute"),
    (["sweep=a//b"], "sweep=a//b: it holds an empty part"),
    (["model=hf", "model.path=/m", "model.name=org/model"], "model.name=org/model: it holds a '/'"),
    (["variant=.."], "variant=..: it is '..'"),
    (["-m", "sweep=fine,../escape"], "sweep=../escape: it holds '..'"),  # each job of a sweep
])
def test_a_value_that_becomes_a_path_part_cannot_leave_out_root(tmp_path, args, key, unimportable):
    """Issue 32 F5: `sweep=../escape` wrote a completed run beside the results; every value that becomes a folder
    of the run path is checked before any work: one line, exit 2, nothing written anywhere."""
    out = tmp_path / "results"
    cp = run_cli(*[a.format(tmp=tmp_path) for a in args], f"out_root={out}", "tracking=disabled",
                 unimportable=unimportable)
    assert cp.returncode == 2, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qrl-bench: error: ") and key in lines[0], cp.stderr
    assert "must stay below out_root" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no results, no escape/, no abs/


def test_every_spelling_of_true_is_refused_on_a_sweep():
    """Issue 32 F6: `choice(false,true)`, `range(0,2)` and `'true'` got past the up-front guard (a string match);
    now each job the sweep will launch is composed and its train.overwrite read as Hydra gives it."""
    from bench.launch.overrides import SWEEP_OVERWRITE, check_overrides

    for spelling in ("True", "'true'", "yes", "1", "choice(false,true)", "range(0,2)"):
        assert check_overrides(["-m", "method=bf16", f"train.overwrite={spelling}"]) == SWEEP_OVERWRITE, spelling
    assert check_overrides(["-m", "method=bf16", "train.overwrite=false,no,0"]) is None
    assert check_overrides(["method=bf16", "train.overwrite=true"]) is None  # one run: the way to redo it


def test_a_sweep_is_checked_job_by_job_as_its_sweeper_expands_it():
    """Issue 32 F1: `-m method=naive,tis rollout.precision=int8,fp8_e4m3` was refused for method=bf16 (each swept
    value was tried against the defaults of the others); now the four jobs it runs are checked, and a fixed-precision
    arm in a sweep over precisions is one job at its own precision, not a refusal."""
    from bench.launch.config import validate
    from bench.launch.overrides import check_overrides

    def values(cfg) -> str | None:
        try:
            validate(cfg)
        except ValueError as e:
            return str(e)
        return None

    assert check_overrides(["-m", "method=naive,tis", "rollout.precision=int8,fp8_e4m3", "sweep=x"], values) is None
    assert check_overrides(["-m", "method=bf16,naive", "rollout.precision=mxfp4,int8", "seed=0,1"], values) is None
    assert "method=bf16 is the bf16 baseline" in check_overrides(["method=bf16", "rollout.precision=int8"], values)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs a /proc file system (Linux)")
def test_out_root_in_a_directory_no_one_can_make_folders_in_is_one_line(unimportable):
    """os.access tells root that /proc is writable; Hydra then failed making its output directory in a logging
    traceback (exit 1). The results directory is now probed by making (and removing) a folder in it."""
    from bench.run.store import unwritable

    cp = run_cli("out_root=/proc/qrl-bench-results", "tracking=disabled", unimportable=unimportable)
    assert cp.returncode == 2, cp.stderr
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and "results directory /proc/qrl-bench-results is not writable" in lines[0], cp.stderr
    assert "cannot make a directory in /proc" in lines[0]
    assert unwritable(REPO / "no-such-folder" / "below") is None  # a writable parent: the probe leaves nothing
    assert not [p for p in REPO.iterdir() if p.name.startswith(".qrl-probe-")]


def test_a_name_registered_twice_is_one_line_before_any_work():
    """A contributor's new arm registered under an existing name ("tis") made every command, `method=naive` included,
    end in a 27-line traceback with exit 1; the check names both components in one line, exit 2. The duplicate is
    registered here by wrapping METHODS' discovery in the checker's own process (the real command's child)."""
    code = (
        "import sys\n"
        "from bench.registry import METHODS\n"
        "found = METHODS.discover\n"
        "def discover():\n"
        "    found()\n"
        "    METHODS.register('tis')(type('Copy', (), {'__module__': 'bench.methods.copy'}))\n"
        "METHODS.discover = discover\n"
        "from bench.launch.entry import FAILED, _check\n"
        "sys.exit(0 if _check(['method=naive']) == FAILED else 1)\n"
    )
    cp = run_python(code)
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.strip().splitlines() == [
        "qrl-bench: error: method 'tis' is registered twice: bench.methods.tis.TIS and bench.methods.copy.Copy; "
        "give one of them another name"]


@pytest.fixture
def conf_copy(tmp_path, monkeypatch):
    """A copy of conf/ the test may break, in place of the repository's for bench.launch.overrides (in process)."""
    import shutil

    from bench.launch import config

    config.register_configs()
    copy = tmp_path / "repo" / "conf"
    shutil.copytree(config.CONF_DIR, copy)  # conf/experiment -> ../sweeps: copied as files
    monkeypatch.setattr(config, "CONF_DIR", copy)
    return copy


@pytest.mark.parametrize("line, expected", [
    ("name: tis_clip", "conf/method/tis.yaml: sets method.name, which is the option's name and is set from the file "
                       "name; remove 'name:' from the yaml"),
    ("is_cap_c: 5.0", "conf/method/tis.yaml: method has no key 'is_cap_c' (did you mean 'is_cap_C'?); its keys: "
                      "denominator, is_cap_C, is_cap_low, is_level, is_mode, is_seq_ratio"),
    ("is_cap_C: [1", "conf/method/tis.yaml, line 3: not valid YAML: while parsing a flow sequence expected ',' or "
                     "']', but got '<stream end>'"),
])
def test_a_broken_yaml_is_named_with_its_key(conf_copy, line, expected):
    """A contributor's yaml error was cut to Hydra's first line ("In 'method/tis': ReadonlyConfigError raised while
    composing config:"), blamed on the whole command line; a yaml that does not parse ended in a traceback."""
    from bench.launch.overrides import check_overrides

    yaml_file = conf_copy / "method" / "tis.yaml"
    yaml_file.write_text(yaml_file.read_text().rstrip("\n").split("\n")[0] + f"\n\n{line}\n")
    for args in (["method=tis", "--dry-run"], ["-m", "method=tis,naive", "--dry-run"]):
        assert check_overrides(args) == expected


def test_a_yaml_without_a_registered_component_says_the_names_must_agree(conf_copy):
    """conf/method/tis_x.yaml beside no `@METHODS.register("tis_x")`: the message named Hydra's internal group
    (`_schema/method=tis_x: unknown _schema/method`) and its hint led to a name with no yaml."""
    from bench.launch.overrides import check_overrides

    (conf_copy / "method" / "tis_x.yaml").write_text("is_cap_C: 3.0\n")
    error = check_overrides(["method=tis_x", "--dry-run"])
    assert error.startswith("method=tis_x: conf/method/tis_x.yaml has no method registered under its name (did you "
                            "mean 'tis'?); the name a component registers (bench/registry.py) must be its yaml's "
                            "file name. Registered: acr, "), error
