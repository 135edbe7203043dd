"""The documentation: a README that fits on a few screens, links that resolve, no pointer outside the repository,
and command examples that name config options which exist.

Cheap on purpose (reads Markdown and lists conf/; imports nothing of bench), so it runs in `scripts/test.sh --quick`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 220

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
#: `group=option` on a command line, for the groups whose options are yaml files under conf/<group>/
OVERRIDE = re.compile(r"(?:^|\s)(\+?)(experiment|method|model|task|rollout|tracking|hydra/launcher|hydra/sweeper)"
                      r"=([^\s]+)")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines inside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped (word characters, '-' and spaces
    kept), spaces to '-'; inline code and link syntax removed first."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        k = seen.get(s, 0)
        out.add(s if k == 0 else f"{s}-{k}")
        seen[s] = k + 1
    return out


def test_readme_fits_on_a_few_screens():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; keep it <= {README_MAX_LINES} and move detail to docs/"


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS if p.name != "README.md" and f"({p.name}" not in index]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    """Every relative link (and image) points at an existing file, and its #anchor at a heading of that file."""
    broken = []
    for n, line in prose_lines(page):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"line {n}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"line {n}: {target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_outside_the_repository(page: Path):
    """The repository is complete on its own: no pointer to the research notes it was written from."""
    bad = [f"line {n}: {line.strip()}" for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
           if "../shared" in line or "methods.md" in line]
    assert not bad, f"{page.relative_to(ROOT)} refers outside the repository:\n" + "\n".join(bad)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_command_examples_name_existing_options(page: Path):
    """`group=option` in a qrl-bench command of a code block names a yaml of conf/<group>/ (placeholders such as
    <recipe> are skipped)."""
    bad = []
    for n, line in code_lines(page):
        if "qrl-bench" not in line and "python -m bench " not in line:
            continue
        for _, group, value in OVERRIDE.findall(line):
            folder = ROOT / "conf" / group
            for option in value.split(","):
                if not option or any(c in option for c in "<>$*{}[]") or option.endswith("..."):
                    continue
                if not (folder / f"{option}.yaml").is_file():
                    choices = sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))
                    bad.append(f"line {n}: {group}={option} (choices: {', '.join(choices)})")
    assert not bad, f"{page.relative_to(ROOT)}: unknown config options in examples:\n" + "\n".join(bad)


def test_slug_matches_github():
    assert slug("Weights & Biases") == "weights--biases"
    assert slug("`algo.*`: the shared policy-gradient knobs") == "algo-the-shared-policy-gradient-knobs"
    assert slug("2. The shared core") == "2-the-shared-core"


@pytest.mark.parametrize("group", ["method", "task", "rollout", "experiment"])
def test_the_configuration_page_names_every_option_of_the_groups(group: str):
    """The Groups table of docs/configuration.md lists each option of these groups (a new arm, task, engine or named
    sweep is named there); paper recipes are listed as the pattern paper/<recipe>."""
    row = next(line for line in (ROOT / "docs" / "configuration.md").read_text().splitlines()
               if line.startswith(f"| `{group}/`"))
    named = {word for span in re.findall(r"`([^`]+)`", row) for word in span.split()}
    options = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
    assert options <= named, f"docs/configuration.md's {group}/ row lacks {sorted(options - named)}"


def test_every_list_of_the_precisions_names_each_registered_one():
    """README, docs/arms.md and docs/configuration.md each list the precisions by hand (`fp32 bf16 ...`): a new
    precision module (bench/quant/<format>.py, `@FORMATS.register`) left them stale with nothing to say so."""
    registered = {name for path in (ROOT / "bench" / "quant").glob("*.py")
                  for name in re.findall(r'@FORMATS\.register\("([a-z0-9_]+)"\)', path.read_text())}
    assert {"fp32", "bf16", "fp8_e4m3", "int8"} <= registered
    lists = [(page.name, set(span.split())) for page in (README, ROOT / "docs" / "arms.md", ROOT / "docs" / "configuration.md")
             for span in re.findall(r"`(fp32 bf16 [^`]+)`", " ".join(page.read_text().split()))]
    for page, named in lists:
        assert named <= registered, f"{page} names precisions that do not exist: {sorted(named - registered)}"
    full = [(page, named) for page, named in lists if len(named) > len(registered) / 2]  # not a subset's (vLLM's 3)
    assert len(full) >= 3, lists
    stale = [f"{page} lacks {sorted(registered - named)}" for page, named in full if named != registered]
    assert not stale, f"add the new precision to each hand-kept list: {'; '.join(stale)}"
