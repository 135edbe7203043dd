"""The command end to end: figures, tables and a report that stands on its own; broken runs listed."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from analysis.cli import main
from analysis.lockfile import lock_sha256, read_lock
from analysis.load import load_sweeps
from analysis.plots import plot_diagnostics, plot_quant
from tests.hang import HANG_S

from .conftest import CliResult
from .synth import BROKEN, GIT_SHA, TASKS, VERSIONS, add_broken_runs, write_run

FIGURES = (  # the synthetic sweep spans three rollout precisions (bf16, fp8_e4m3, int8): it has severity figures,
    # and a resolved naive gap on each task: the recovered share against T·KL
    [f"{kind}_{task}_tiny" for kind in ("severity", "recovered", "curves", "mismatch", "diagnostics", "quant")
     for task in TASKS]
    + ["throughput_tiny"]
    + ["tkl"]  # two tasks, each with a naive arm: both on one T·KL axis, the report's headline
)


def test_cli_succeeds_and_prints_only_the_report_path(cli_run: CliResult):
    assert cli_run.rc == 0, cli_run.stderr
    assert cli_run.stdout == f"{cli_run.out / 'report.md'}\n"
    assert "36 run(s) used, 9 left out" in cli_run.stderr


def test_every_figure_exists_as_png_and_pdf(cli_run: CliResult):
    fig_dir = cli_run.out / "figures"
    assert sorted(p.name for p in fig_dir.iterdir()) == sorted(f"{n}.{ext}" for n in FIGURES for ext in ("png", "pdf"))
    for name in FIGURES:
        png, pdf = (fig_dir / f"{name}.png").read_bytes(), (fig_dir / f"{name}.pdf").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000, name
        assert pdf.startswith(b"%PDF") and len(pdf) > 5_000, name


def test_tables_are_written_in_three_formats(cli_run: CliResult):
    for name in ("severity", "results", "accuracy", "throughput"):
        for ext in ("csv", "md", "tex"):
            assert (cli_run.out / "tables" / f"{name}.{ext}").stat().st_size > 0
    assert len((cli_run.out / "tables" / "runs.csv").read_text().splitlines()) == 1 + 36


def test_report_embeds_everything_and_states_provenance(cli_run: CliResult):
    text = (cli_run.out / "report.md").read_text()
    # issue 25 item 4: it opens with the verdict (sentences, before any table), then the headline figure
    opening = text.split("\n\n")[1]
    assert opening.startswith("36 runs: 6 arms × 2 tasks (arithmetic, countdown), n = 3 seeds per arm")
    assert "95 % interval" in opening and not opening.startswith("|")
    # the headline figure (figures/tkl.png) under its own title
    assert text.split("\n\n")[2] == "## Correction against sequence-level mismatch — every cell"
    assert text.split("\n\n")[3].startswith("![Correction against sequence-level mismatch — every cell](figures/tkl.png)")
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links, "no links in report"
    for link in links:
        assert (cli_run.out / link).is_file(), link
    embedded = set(re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\.png\)", text))
    assert embedded == set(FIGURES)
    assert "[appendix](appendix.md)" in text
    text += (cli_run.out / "appendix.md").read_text()  # provenance, configuration and the runs used
    assert GIT_SHA in text
    for pkg, ver in VERSIONS.items():
        assert f"| {pkg} | {ver} (36) |" in text
    assert "**Seeds**: 0, 1, 2" in text
    assert "| CPU · kernel ISA | Intel Xeon [avx2] · cpu (AVX2) (36) |" in text
    # the synthetic runs recorded transformers 4.57.1; requirements.lock pins another version: flagged
    pinned = read_lock()["transformers"]
    assert f"36 run(s) recorded package versions that differ from `requirements.lock`: " in text
    assert f"transformers {VERSIONS['transformers']} (lock {pinned})" in text
    assert f"requirements.lock sha256 {lock_sha256()}: 36 run(s) off the lock" in text
    assert "**Training steps** (train.steps): `12` (36)" in text
    assert "| bf16 | BF16 | **70.0 ± 10.0** | **40.0 ± 10.0** | **55.0** |" in text
    assert "sweep/naive/arithmetic/tiny/seed2` (non-finite loss)" in text  # diverged run named


def test_report_lists_every_broken_run_with_its_reason(cli_run: CliResult):
    text = (cli_run.out / "report.md").read_text()
    left_out = text.split("## Runs left out", 1)[1]
    for rel, fragment in BROKEN.items():
        line = next((ln for ln in left_out.splitlines() if f"sweep/{rel} |" in ln), None)
        assert line is not None, rel
        assert fragment.replace("|", "\\|") in line, (rel, line)
    assert "**Warnings on runs used**: 1 (listed in the appendix)" in text
    assert "dropped unreadable last line" in (cli_run.out / "appendix.md").read_text()  # the warning on a kept run


def test_sweep_with_no_usable_run_still_reports_and_exits_1(tmp_path: Path):
    root = tmp_path / "sweep"
    write_run(root, "tis", "arithmetic", 0, status="running", steps_logged=3, final_acc=0.5)
    add_broken_runs(root)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([str(root), "--out", str(tmp_path / "rep")])
    assert rc == 1
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "No usable runs" in report and "status=running" in report
    assert out.getvalue().strip() == str(tmp_path / "rep" / "report.md")


def test_missing_sweep_dir_is_a_usage_error(tmp_path: Path):
    err = io.StringIO()
    with redirect_stderr(err):
        assert main([str(tmp_path / "missing")]) == 2
    assert "does not exist" in err.getvalue()
    (tmp_path / "smoke_short").mkdir()  # a misspelt sweep: the close name and the directories there
    err = io.StringIO()
    with redirect_stderr(err):
        assert main([str(tmp_path / "smoke_shor")]) == 2
    assert f"does not exist; did you mean {tmp_path / 'smoke_short'}? (directories in {tmp_path}: " in err.getvalue()


def test_a_sweep_dir_without_runs_is_a_usage_error_and_leaves_its_report_alone(tmp_path: Path):
    """A fresh clone's results/<sweep> holds only the committed report: analysing it must not write over it."""
    report_dir = tmp_path / "sweep" / "report"
    (report_dir / "tables").mkdir(parents=True)
    files = {report_dir / "report.md": "# the committed report\n", report_dir / "tables" / "runs.csv": "run\nx\n"}
    for path, text in files.items():
        path.write_text(text)
    err = io.StringIO()
    with redirect_stderr(err):
        assert main([str(tmp_path / "sweep")]) == 2
    assert f"no run directory under {tmp_path / 'sweep'}" in err.getvalue()
    assert sorted(p for p in report_dir.rglob("*") if p.is_file()) == sorted(files)
    assert all(path.read_text() == text for path, text in files.items())


def test_python_dash_m_analysis_is_the_same_command():
    cp = subprocess.run([sys.executable, "-m", "analysis", "--help"], capture_output=True, text=True, timeout=HANG_S)
    assert cp.returncode == 0 and "qrl-analyze" in cp.stdout and "--wandb" in cp.stdout
    cp = subprocess.run([sys.executable, "-m", "analysis"], capture_output=True, text=True, timeout=HANG_S)
    assert cp.returncode == 2 and "SWEEP_DIR" in cp.stderr


def test_figures_without_data_are_skipped_not_drawn_empty(tmp_path: Path):
    # bf16 logs no quant/* and no method/* diagnostics: those figures must not exist for it.
    root = tmp_path / "sweep"
    write_run(root, "bf16", "arithmetic", 0)
    sweep = load_sweeps([root])
    assert plot_quant(sweep, "arithmetic", "tiny", tmp_path / "f") is None
    assert plot_diagnostics(sweep, "arithmetic", "tiny", tmp_path / "f") is None
    assert not (tmp_path / "f").exists()


def test_bad_options_are_usage_errors(tmp_path: Path):
    cases = {("--group", "g", str(tmp_path)): "--group/--offline need --wandb",
             (str(tmp_path), "--formats", "png,xyz"): "--formats 'png,xyz': choose from",
             (str(tmp_path), "--smooth", "0"): "--smooth 0: must be >= 1",
             (str(tmp_path), "--collapse-k", "0"): "--collapse-k 0: must be >= 1",  # the flag and value at fault
             (str(tmp_path), "--warmup", "-1"): "--warmup -1: must be >= 0"}
    for argv, message in cases.items():
        err = io.StringIO()
        with redirect_stderr(err):
            try:
                main(list(argv))
            except SystemExit as e:
                assert e.code == 2, argv
            else:
                raise AssertionError(f"{argv} accepted")
        assert message in err.getvalue(), (argv, err.getvalue())
        assert len(err.getvalue().splitlines()) == 1, err.getvalue()  # one line, not argparse's usage above it


def test_an_unknown_baseline_or_naive_is_refused_naming_the_methods_found(tmp_path: Path):
    """A misspelt --baseline used to give exit 0 and a report saying "No arm differs from bf61"."""
    root = tmp_path / "sweep"
    for method in ("bf16", "naive", "tis"):
        write_run(root, method, "arithmetic", 0)
    for argv in (["--baseline", "bf61"], ["--naive", "fp8"]):
        err = io.StringIO()
        with redirect_stderr(err):
            rc = main([str(root), "--out", str(tmp_path / "rep"), *argv])
        assert rc == 2, argv
        assert f"{argv[0]} '{argv[1]}' names no method" in err.getvalue()
        assert "choose from: bf16, naive, tis" in err.getvalue()
        assert not (tmp_path / "rep").exists()  # refused before writing anything


def test_the_help_states_the_defaults_the_code_uses():
    """`--help` said --naive defaults to fp8 while the code used naive."""
    from analysis.arms import BASELINE, NAIVE
    from analysis.cli import build_parser
    from analysis.runs import SeverityOptions

    parser = build_parser()
    helps = {a.dest: " ".join(a.help.split()) for a in parser._actions if a.dest in ("baseline", "naive")}
    assert helps["naive"].endswith(f"(default: {NAIVE})") and helps["baseline"].endswith(f"(default: {BASELINE})")
    assert (SeverityOptions().naive, SeverityOptions().baseline) == (NAIVE, BASELINE) == ("naive", "bf16")


def test_every_figure_is_under_its_own_heading(cli_run: CliResult):
    """The heading "Accuracy against mismatch across severities" sat over the recovered-share figure."""
    text = (cli_run.out / "report.md").read_text()
    heading, under = "", {}
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:]
        elif m := re.match(r"!\[.*\]\(figures/(\S+)\.png\)", line):
            under[m.group(1)] = heading
    assert sorted(under) == sorted(FIGURES)
    sections = {"tkl": "Correction against sequence-level mismatch — every cell", "severity": "Accuracy against "
                "mismatch across severities", "recovered": "Recovered share of the naive gap against T·KL",
                "curves": "Learning curves", "mismatch": "Rollout–training mismatch", "diagnostics": "Method diagnostics",
                "throughput": "Throughput", "quant": "Weight update vs quantization error (QuRL Eq. 13–14)"}
    assert under == {name: sections[name.split("_")[0]] for name in FIGURES}


def test_the_log_names_every_figure_written(cli_run: CliResult):
    """The log listed the figures of make_figures only, not the severity_* / recovered_* / tkl ones."""
    logged = re.findall(r"\[qrl-analyze\] figure (\S+)", cli_run.stderr)
    assert sorted(logged) == sorted(FIGURES) == sorted(p.stem for p in (cli_run.out / "figures").glob("*.png"))


def test_the_verdict_lists_every_recovered_share_and_says_which_are_missing(cli_run: CliResult):
    """The opening listed the three highest shares only, dropping the others without a word (smoke_short: acr_uaq
    -3 % and ess -241 % were missing)."""
    opening = (cli_run.out / "report.md").read_text().split("\n\n")[1]
    sentence = next(s for s in opening.split(". ") if s.startswith("Share of the naive arm's gap"))
    listed = re.findall(r"(?:: |; )(\w+) (-?\d+) % (?:\[-?\d+, -?\d+\] % \(n=3\)|\(interval unbounded, n=3\))", sentence)
    assert len(listed) == 6  # the six corrections x tasks with a defined share (the table's cells), each with its n
    # issue 35 item 5: the shares' intervals are simultaneous over the six (Bonferroni), so some are unbounded
    assert "Fieller intervals simultaneous over its 6 shares, each at 99.2 %" in sentence
    shares = [int(v) for _, v in listed]
    assert shares == sorted(shares, reverse=True)
    assert "(none in the other 2 arm-severity cells: no naive run at this severity; the severity table says which)" \
        in sentence


def test_the_verdict_names_the_baseline_it_compared_with_or_says_there_is_none(tmp_path):
    """Issue 32 F10: a sweep without a bf16 run said "No arm differs from bf16", a comparison never made."""
    from analysis.load import load_sweeps
    from analysis.runs import SeverityOptions
    from analysis.verdict import verdict

    from .synth import write_run

    root = tmp_path / "sweep"
    for method in ("naive", "tis"):
        for seed in (0, 1):
            write_run(root, method, "arithmetic", seed)
    sweep = load_sweeps([root])
    opening = " ".join(verdict(sweep, SeverityOptions()))
    assert "No arm is compared with a baseline: the sweep has no bf16 run" in opening
    assert "differs from bf16" not in opening and "differ from bf16" not in opening
    with_naive_as_baseline = " ".join(verdict(sweep, SeverityOptions(baseline="naive")))
    assert "compared with a baseline" not in with_naive_as_baseline
    assert "from naive" in with_naive_as_baseline  # the baseline that is present is named


def test_a_primary_arm_that_can_have_no_test_is_refused(tmp_path: Path):
    """`--primary naive` (the arm every primary one is tested against), `--primary bf16` (never run at a precision
    where naive ran) and an arm whose runs there all diverged before an evaluation used to exit 0 with no
    pre-registered row, while the report's settings named them."""
    root = tmp_path / "sweep"
    for method in ("bf16", "naive", "tis", "ais"):
        run = write_run(root, method, "arithmetic", 0, status="diverged" if method == "ais" else "completed")
    (run / "eval.jsonl").write_text("")  # ais diverged before its first evaluation: loaded, but no comparison has it
    for arm, why in (("naive", "is the arm each primary one is tested against"),
                     ("bf16", "has no evaluated run at a rollout setting where 'naive' has one"),
                     ("ais", "has no evaluated run at a rollout setting where 'naive' has one")):
        err = io.StringIO()
        with redirect_stderr(err):
            rc = main([str(root), "--out", str(tmp_path / "rep"), "--primary", f"tis,{arm}"])
        assert rc == 2 and f"--primary '{arm}' {why}" in err.getvalue(), err.getvalue()
        assert "arms with a test against 'naive': tis" in err.getvalue()
        assert not (tmp_path / "rep").exists()


def test_arms_compared_with_each_other_on_other_settings_are_named(tmp_path: Path):
    """naive trained with another learning rate than bf16 was compared with no word (a gap of another lr is not the
    precision's); the report and the log name the setting and which arms hold each value. A sweep's own runs
    (one config but the arm) give no such warning."""
    import yaml

    root = tmp_path / "sweep"
    for method in ("bf16", "naive"):
        for seed in (0, 1):
            write_run(root, method, "arithmetic", seed)
    clean = load_sweeps([root])
    from analysis.load import compared_apart

    assert compared_apart(clean) == []
    for seed in (0, 1):
        cfg_file = root / "naive" / "arithmetic" / "tiny" / f"seed{seed}" / "config.yaml"
        cfg = yaml.safe_load(cfg_file.read_text())
        cfg["train"]["lr"] = 3e-5
        cfg_file.write_text(yaml.safe_dump(cfg))
    [line] = compared_apart(load_sweeps([root]))
    assert line.startswith("train.lr: ") and "(naive@fp8_e4m3 ×2)" in line and "(bf16@bf16 ×2)" in line, line
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        assert main([str(root), "--out", str(tmp_path / "rep"), "--formats", "png"]) == 0
    assert "warning: runs compared with each other differ in train.lr" in err.getvalue()
    assert "**Warning**: runs compared with each other differ in settings" in (tmp_path / "rep" / "report.md").read_text()
