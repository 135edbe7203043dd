"""Where a benchmark's rows come from: a Hugging Face Hub id, or a local copy (file or folder).

`task.source` is one of
* a hub id such as "openai/gsm8k": loaded with `datasets.load_dataset(id, config, split=...)`, which uses the
  local datasets cache when offline;
* a data file: .parquet, .arrow (datasets' cache / save format), .jsonl, or .json (JSON lines or one array
  of objects, like DeepScaleR's deepscaler.json). A file is one split: it is returned whatever split is asked;
* a folder: a copy of the hub repository (`hf download ID --repo-type dataset --local-dir DIR`, or a hub cache
  snapshot), a folder of per-split files, or a `Dataset(Dict).save_to_disk` folder. For split S and config C
  the files are looked up in DIR/C when that subfolder exists (gsm8k keeps `main/train-00000-of-00001.parquet`),
  else in DIR, trying in order: S.<ext>, S-*.<ext> (hub shards), S_*.<ext>, data/S.<ext>, data/S-*.<ext>,
  S/*.<ext>, data/S/*.<ext>. Data files whose names hold no split word form the "train" split, as on the
  hub (DAPO-Math-17k keeps `data/dapo-math-17k.parquet`).

Local files are read with pyarrow and json directly (no datasets cache is written) and rows come back as
the same plain Python values `datasets` gives: structs as dicts, lists as lists. Errors are one line that
names the file, e.g. a corrupt parquet, non-UTF-8 JSON, an empty file, or missing columns (found vs needed).
With the hub unreachable and the dataset not cached, `HubUnavailableError` names the dataset and says how to
point `task.source` at a local copy.

The split helpers at the end (`holdout`, `subsample`) make train/test splits and subsets a function of a seed
only, so every RL seed sees the same problems.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

DATA_EXTENSIONS = (".parquet", ".arrow", ".jsonl", ".json")  # also the preference order within one split
SPLIT_WORDS = ("train", "test", "validation", "valid", "val", "dev", "eval")
BATCH_ROWS = 4096
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_SPLIT_WORD = re.compile(r"(?:^|[-_.])(" + "|".join(SPLIT_WORDS) + r")(?:[-_.]|$)", re.IGNORECASE)

LAYOUTS = ("a data file (.parquet, .arrow, .jsonl, .json), a folder laid out like the hub repository "
           "(e.g. main/train-00000-of-00001.parquet, data/test-00000-of-00001.parquet, test.jsonl), "
           "a folder of <split>.parquet / <split>.jsonl files, or a folder written by datasets' save_to_disk")


class DataSourceError(ValueError):
    """A local file or folder that cannot be read as the dataset; the message names it."""


class HubUnavailableError(ConnectionError):
    """The dataset is neither reachable on the hub nor in the local cache; the message says what to do."""


@dataclass(frozen=True)
class ResolvedSplit:
    """Where one split's rows are: kind "hub" (an id), "files" (data files) or "saved" (a save_to_disk folder)."""

    source: str
    split: str
    config: str | None
    kind: str
    paths: tuple[str, ...] = ()

    def describe(self) -> str:
        config = f", config {self.config!r}" if self.config else ""
        where = self.source if self.kind == "hub" else ", ".join(self.paths)
        return f"{self.kind} {where} (split {self.split!r}{config})"


# ---- resolving a source ---------------------------------------------------------------------------------


def is_local(source: str) -> bool:
    """True for a path that exists or is written like one; False for a hub id such as 'openai/gsm8k'."""
    path = os.path.expanduser(source)
    if os.path.exists(path):
        return True
    return (source.startswith(("/", "./", "../", "~", ".\\")) or source.lower().endswith(DATA_EXTENSIONS)
            or _HUB_ID.fullmatch(source) is None)


def missing_local_source(source: str) -> str | None:
    """Why `source`, written as a local path, names nothing (None for a hub id or a path that exists): the part of
    `resolve_split` the config check runs before any work."""
    path = os.path.abspath(os.path.expanduser(source))
    if not is_local(source) or os.path.exists(path):
        return None
    return f"task.source {source!r}: no such file or folder (resolved to {path}); give a hub id or a local copy: {LAYOUTS}"


def resolve_split(source: str, split: str, *, config: str | None = None) -> ResolvedSplit:
    """Where the rows of `split` of `source` are; raises DataSourceError / FileNotFoundError if nowhere."""
    if not source or str(source) in ("???", "None"):
        raise ValueError("task.source is not set: give a hub id (e.g. openai/gsm8k) or a local file or folder")
    source = str(source)
    if not is_local(source):
        return ResolvedSplit(source, split, config, "hub")
    path = os.path.abspath(os.path.expanduser(source))
    if os.path.isfile(path):
        if not path.lower().endswith(DATA_EXTENSIONS):
            raise DataSourceError(f"{path}: not a data file; use one of {', '.join(DATA_EXTENSIONS)}, or {LAYOUTS}")
        return ResolvedSplit(source, split, config, "files", (path,))
    if os.path.isdir(path):
        return _resolve_folder(source, path, split, config)
    raise FileNotFoundError(missing_local_source(source) or f"task.source {source!r}: {path} is neither a file nor a folder")


def _resolve_folder(source: str, folder: str, split: str, config: str | None) -> ResolvedSplit:
    if os.path.isfile(os.path.join(folder, "dataset_dict.json")) or os.path.isfile(os.path.join(folder, "state.json")):
        return ResolvedSplit(source, split, config, "saved", (folder,))
    base = os.path.join(folder, config) if config and os.path.isdir(os.path.join(folder, config)) else folder
    for pattern in (f"{split}.*", f"{split}-*", f"{split}_*", f"data/{split}.*", f"data/{split}-*",
                    f"{split}/*", f"data/{split}/*"):
        files = _data_files(glob.glob(os.path.join(glob.escape(base), pattern)))
        if files:
            return ResolvedSplit(source, split, config, "files", tuple(files))
    top = glob.escape(base)
    unnamed = _data_files(glob.glob(os.path.join(top, "*")) + glob.glob(os.path.join(top, "data", "*")))
    if unnamed and not any(_SPLIT_WORD.search(os.path.basename(f)) for f in unnamed):
        if split == "train":
            return ResolvedSplit(source, split, config, "files", tuple(unnamed))
        raise DataSourceError(f"{base}: no {split!r} split; its data files ({_listing(unnamed, base)}) have no split "
                              f"name, so they are the 'train' split, as on the hub")
    subfolders = sorted(e for e in os.listdir(base) if os.path.isdir(os.path.join(base, e)) and e != "data")
    hint = f"; set task.config to one of its subfolders: {', '.join(subfolders)}" if subfolders and not config else ""
    config_note = (f" (config {config!r}: no such subfolder, looked in the folder itself)"
                   if base == folder and config else "")
    raise DataSourceError(f"{base}: no data file for split {split!r}{config_note}{hint}; found: "
                          f"{_listing(os.listdir(base), None) or 'nothing'}; accepted: {LAYOUTS}")


def _data_files(paths: Sequence[str]) -> list[str]:
    """The data files among `paths`, sorted, of a single extension (parquet preferred) so no split is read twice."""
    files = [p for p in paths if os.path.isfile(p) and p.lower().endswith(DATA_EXTENSIONS)]
    for ext in DATA_EXTENSIONS:
        chosen = sorted(p for p in files if p.lower().endswith(ext))
        if chosen:
            return chosen
    return []


def _listing(names: Sequence[str], base: str | None, limit: int = 12) -> str:
    shown = sorted(os.path.relpath(n, base) if base else n for n in names)
    return ", ".join(shown[:limit]) + (f", ... ({len(shown)} in all)" if len(shown) > limit else "")


# ---- reading rows ---------------------------------------------------------------------------------------


def iter_rows(resolved: ResolvedSplit, *, required: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
    """The rows of a resolved split as dicts, checking that `required` columns exist."""
    if resolved.kind == "hub":
        yield from _iter_hub(resolved, required)
    elif resolved.kind == "saved":
        yield from _iter_saved(resolved, required)
    else:
        for path in resolved.paths:
            yield from _iter_file(path, required)


def load_split(source: str, split: str, *, config: str | None = None, required: Sequence[str] = ()) -> list[dict]:
    """All rows of `split` of `source` (a hub id, a data file or a folder); see the module docstring."""
    return list(iter_rows(resolve_split(source, split, config=config), required=required))


def _check_columns(where: str, found: Sequence[str], required: Sequence[str]) -> None:
    missing = [c for c in required if c not in found]
    if missing:
        raise DataSourceError(f"{where}: missing column(s) {', '.join(missing)}; columns found: "
                              f"{', '.join(found) or 'none'}; needed: {', '.join(required)}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:300] + "...") if len(text) > 300 else text or type(exc).__name__


def _iter_file(path: str, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    if os.path.getsize(path) == 0:
        raise DataSourceError(f"{path}: the file is empty")
    lower = path.lower()
    if lower.endswith(".parquet"):
        yield from _iter_parquet(path, required)
    elif lower.endswith(".arrow"):
        yield from _iter_arrow(path, required)
    else:
        yield from _iter_json(path, required)


def _iter_parquet(path: str, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise DataSourceError(f"{path}: not a readable parquet file ({_one_line(exc)})") from None
    _check_columns(path, reader.schema_arrow.names, required)
    if reader.metadata.num_rows == 0:
        raise DataSourceError(f"{path}: the parquet file has no rows")
    try:
        for batch in reader.iter_batches(batch_size=BATCH_ROWS):
            yield from batch.to_pylist()
    except (pa.ArrowException, OSError, ValueError) as exc:  # truncated pages, invalid UTF-8 in a string column
        raise DataSourceError(f"{path}: corrupt parquet data ({_one_line(exc)})") from None


def _iter_arrow(path: str, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    import pyarrow as pa

    try:
        with pa.memory_map(path) as source:
            try:  # datasets writes the IPC stream format; plain pyarrow users often the file format
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise DataSourceError(f"{path}: not a readable Arrow file ({_one_line(exc)})") from None
    _check_columns(path, table.column_names, required)
    if table.num_rows == 0:
        raise DataSourceError(f"{path}: the Arrow file has no rows")
    try:
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            yield from batch.to_pylist()
    except (pa.ArrowException, ValueError) as exc:
        raise DataSourceError(f"{path}: corrupt Arrow data ({_one_line(exc)})") from None


def _iter_json(path: str, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataSourceError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    if not text.strip():
        raise DataSourceError(f"{path}: the file holds only whitespace, no rows")
    if text.lstrip().startswith("["):  # one JSON array of objects (e.g. deepscaler.json)
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataSourceError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
        numbered: Iterator[tuple[int, Any]] = enumerate(rows, start=1)
        what = "element"
    else:  # JSON lines
        numbered = ((i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip())
        what = "line"
    seen_any = False
    for number, item in numbered:
        if what == "line":
            try:
                item = json.loads(item)
            except json.JSONDecodeError as exc:
                raise DataSourceError(f"{path} line {number}: invalid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(item, dict):
            raise DataSourceError(f"{path} {what} {number}: expected a JSON object (one row), "
                                  f"got {type(item).__name__}")
        _check_columns(f"{path} {what} {number}", list(item), required)
        seen_any = True
        yield item
    if not seen_any:
        raise DataSourceError(f"{path}: no rows")


def _iter_saved(resolved: ResolvedSplit, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    import datasets

    folder = resolved.paths[0]
    try:
        loaded = datasets.load_from_disk(folder)
    except Exception as exc:  # datasets raises several types for a damaged folder
        raise DataSourceError(f"{folder}: not a readable save_to_disk folder ({_one_line(exc)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if resolved.split not in loaded:
            raise DataSourceError(f"{folder}: the saved DatasetDict has no split {resolved.split!r}; "
                                  f"splits: {', '.join(loaded)}")
        loaded = loaded[resolved.split]
    yield from _iter_dataset(loaded, folder, required)


def _iter_dataset(ds: Any, where: str, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    _check_columns(where, ds.column_names, required)
    for table in ds.with_format("arrow").iter(batch_size=BATCH_ROWS):
        yield from table.to_pylist()


def _iter_hub(resolved: ResolvedSplit, required: Sequence[str]) -> Iterator[dict[str, Any]]:
    import datasets

    name = f"{resolved.source!r}" + (f" (config {resolved.config!r})" if resolved.config else "")
    try:
        ds = datasets.load_dataset(resolved.source, resolved.config, split=resolved.split)
    except ConnectionError as exc:  # datasets raises ConnectionError both offline and when the hub is down
        raise HubUnavailableError(hub_unavailable_message(resolved, exc)) from None
    except Exception as exc:  # unknown id, config or split: say which dataset, keep datasets' explanation
        raise DataSourceError(f"hub dataset {name}, split {resolved.split!r}: {_one_line(exc)}") from None
    yield from _iter_dataset(ds, f"hub dataset {name}, split {resolved.split!r}", required)


def hub_unavailable_message(resolved: ResolvedSplit, exc: BaseException | None = None) -> str:
    """The error for a hub dataset that cannot be fetched: which one, why, and how to use a local copy."""
    offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
               if os.environ.get(v, "").lower() in ("1", "true", "yes", "on")]
    why = (f"offline mode is on ({'='.join([offline[0], os.environ[offline[0]]])})" if offline
           else f"the Hugging Face Hub is unreachable ({_one_line(exc) if exc else 'no connection'})")
    config = f", config {resolved.config!r}" if resolved.config else ""
    return (f"dataset {resolved.source!r} (split {resolved.split!r}{config}) cannot be loaded: {why}, and it is "
            f"not in the local datasets cache. Point the task at a local copy instead: task.source=/path/to/copy, "
            f"where the copy is {LAYOUTS}. To make one on a machine with hub access: "
            f"hf download {resolved.source} --repo-type dataset --local-dir /path/to/copy")


def files_sha256(resolved: ResolvedSplit) -> str | None:
    """A content hash of a local split's files (for cache keys); None for a hub dataset."""
    if resolved.kind == "hub":
        return None
    paths = list(resolved.paths)
    if resolved.kind == "saved":
        paths = sorted(p for p in glob.glob(os.path.join(glob.escape(paths[0]), "**", "*"), recursive=True)
                       if os.path.isfile(p))
    h = hashlib.sha256()
    for path in paths:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


# ---- deterministic splits and subsets -------------------------------------------------------------------


def holdout(rows: Sequence[Any], n_test: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(train, test): `n_test` rows picked by `seed` for test, the rest for train, both in file order.

    For sets published with only a train split (Countdown-Tasks-3to4, DAPO-Math-17k). The test rows depend on
    the seed and the rows only, not on any train-size setting, so the held-out set is stable.
    """
    if n_test < 0:
        raise ValueError(f"the held-out test size must be >= 0, got {n_test}")
    if n_test >= len(rows):
        raise ValueError(f"cannot hold out {n_test} test rows from {len(rows)}: leave some for training")
    chosen = set(random.Random(seed).sample(range(len(rows)), n_test))
    train = [r for i, r in enumerate(rows) if i not in chosen]
    test = [r for i, r in enumerate(rows) if i in chosen]
    return train, test


def subsample(rows: Sequence[Any], limit: int | None, seed: int, *, shuffle: bool = True) -> list[Any]:
    """At most `limit` rows (None or <= 0: all), chosen and ordered by `seed`.

    With shuffle, the rows are permuted by the seed and the first `limit` kept, so a smaller limit gives a
    prefix of a larger one (nested subsets). Without shuffle, the first `limit` rows in file order.
    """
    out = list(rows)
    if shuffle:
        random.Random(seed).shuffle(out)
    if limit is not None and limit > 0:
        out = out[:limit]
    return out
