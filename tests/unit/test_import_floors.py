"""The floors of bench/: every import (module level or inside a function) goes to the same floor or one below,
and no two rooms (a folder, or a top-level module) import each other.

    0 base        registry (the mechanism and every registry), domains (config value ranges), timing, device,
                  grpo/gae/dapo (the loss and advantage math), passk, mismatch, run/, algo_config and train_config
                  (the algo and train schemas, torch-free)
    1 parts       quant/, rewards (scorers, the countdown checker)
    2 components  rollout/ (engines), tasks/, methods/ (arms), eval_config (the eval schema, torch-free)
    3 models      models/ (loaders, tokenizer, log-probs: reads a Rollout)
    4 loop's help compute, critic, advantages, sampling, evaluation, preflight, warmstart, distributed/,
                  checkpoint (the resumable state and its checkpoints)
    5 loop        train
    6 launch      launch/ (with launch/config.py, the composition root: every schema, read only by the launcher),
                  benchmarks/, __main__

A module not named here fails the test: a new one is placed on a floor on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

FLOORS = {
    0: ["registry", "domains", "timing", "device", "grpo", "gae", "dapo", "passk", "mismatch", "run", "algo_config",
        "train_config"],
    1: ["quant", "rewards"],
    2: ["rollout", "tasks", "methods", "eval_config"],
    3: ["models"],
    4: ["compute", "critic", "advantages", "sampling", "evaluation", "preflight", "warmstart", "distributed",
        "checkpoint"],
    5: ["train"],
    6: ["launch", "benchmarks", "__main__"],
}
FLOOR = {room: floor for floor, rooms in FLOORS.items() for room in rooms}


def room(module: str) -> str:
    """bench.rollout.embedded -> rollout; bench.train -> train; bench -> '' (the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_name(path: Path) -> str:
    parts = path.relative_to(BENCH.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The bench.* modules `path` imports anywhere in it (`from bench import x` counts as bench.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "bench"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "bench":
            if node.module != "bench":
                found.add(node.module)
            else:  # `from bench import x` imports the module bench.x only when x is one (not bench.CONF_DIR)
                found |= {f"bench.{a.name}" for a in node.names
                          if (BENCH / f"{a.name}.py").exists() or (BENCH / a.name).is_dir()}
    return found


def room_edges() -> dict[tuple[str, str], list[str]]:
    """(from room, to room) -> the 'module -> module' imports that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(BENCH.rglob("*.py")):
        source = module_name(path)
        for target in imports(path):
            if room(source) and room(target) and room(source) != room(target):
                edges.setdefault((room(source), room(target)), []).append(f"{source} -> {target}")
    return edges


def test_every_room_has_a_floor():
    rooms = {room(module_name(p)) for p in BENCH.rglob("*.py")} - {""}
    assert rooms - set(FLOOR) == set(), "place the new module on a floor in FLOORS"


def test_no_import_runs_up_a_floor():
    upward = [line for (a, b), lines in room_edges().items() if FLOOR[b] > FLOOR[a] for line in lines]
    assert upward == []


def test_no_two_rooms_import_each_other():
    edges = room_edges()
    pairs = sorted({tuple(sorted((a, b))) for a, b in edges if (b, a) in edges})
    assert pairs == [], {p: edges[p] + edges[p[::-1]] for p in pairs}


def test_the_check_sees_imports_inside_functions():
    """The floors hold for lazy imports too (bench.distributed.engines imports bench.sampling inside a function)."""
    assert "bench.sampling" in imports(BENCH / "distributed" / "engines.py")
    assert ("distributed", "sampling") in room_edges()


def test_the_architecture_page_lists_every_room_on_its_floor():
    """docs/architecture.md's table (| floor | `room` | ... |) is this test's FLOORS, row for row: the map cannot go
    stale without this failing."""
    page = (BENCH.parent / "docs" / "architecture.md").read_text()
    rows = [line.split("|") for line in page.splitlines() if line.startswith("| ") and "`" in line.split("|")[2]]
    listed = {cells[2].strip().strip("`"): int(cells[1]) for cells in rows}
    assert len(rows) == len(listed), "a room listed twice"
    assert listed == FLOOR
