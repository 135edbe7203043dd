"""Issue 25 item 4: every .tex table the report writes compiles with pdflatex (Debian's texlive-latex-base, which
scripts/test.sh installs where it may: root and apt). The symbols of the table cells (‖, μ, π, ±, Δ, ×, ≥, …)
must be escaped; a raw one makes pdflatex stop."""

from __future__ import annotations

import io
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from analysis.cli import main
from analysis.tables import latex_escape
from tests.hang import HANG_S

from .conftest import CliResult
from .synth import make_severity_sweep

#: the tables use booktabs (\toprule ...); texlive-latex-base does not ship it, so fall back to \hline there
PREAMBLE = r"""\documentclass{article}
\IfFileExists{booktabs.sty}{\usepackage{booktabs}}{%
  \newcommand{\toprule}{\hline}\newcommand{\midrule}{\hline}\newcommand{\bottomrule}{\hline}}
\usepackage[margin=0.5in,landscape]{geometry}
\begin{document}
\tiny
"""

needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None,
                                    reason="pdflatex not installed (apt-get install texlive-latex-base; "
                                           "scripts/test.sh installs it as root)")


def compile_tex(table: Path, work: Path) -> subprocess.CompletedProcess:
    doc = work / f"{table.stem}_doc.tex"
    doc.write_text(PREAMBLE + f"\\input{{{table.resolve()}}}\n\\end{{document}}\n")
    return subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=work,
                          capture_output=True, text=True, timeout=HANG_S)


def tex_files(cli_run: CliResult, tmp_path: Path) -> list[Path]:
    ladder = make_severity_sweep(tmp_path / "ladder")
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        assert main([str(ladder), "--formats", "png"]) == 0
    return sorted((cli_run.out / "tables").glob("*.tex")) + sorted((ladder / "report" / "tables").glob("*.tex"))


@needs_pdflatex
def test_every_tex_table_compiles(cli_run: CliResult, tmp_path: Path):
    tables = tex_files(cli_run, tmp_path)
    assert {t.stem for t in tables} >= {"severity", "results", "accuracy", "throughput"}
    for table in tables:
        cp = compile_tex(table, tmp_path)
        assert cp.returncode == 0, f"{table}: " + "\n".join(ln for ln in cp.stdout.splitlines() if ln.startswith("!"))
        assert (tmp_path / f"{table.stem}_doc.pdf").stat().st_size > 1000


def test_latex_escape_covers_the_report_symbols():
    text = latex_escape("KL(μ‖π_old) ≥ 1 · ±2 → 3 … Δ×")
    assert text.isascii(), text
