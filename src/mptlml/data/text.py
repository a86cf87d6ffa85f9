"""Text loaders for masked-LM scoring: GLUE and local tables through Hugging Face ``datasets``.

Sources:

- ``glue:TASK`` (``cola``, ``sst2``, ``mrpc``, ``qnli``, ``ax``): the hub's
  ``nyu-mll/glue`` through ``datasets.load_dataset``, cache first: the local
  ``datasets`` cache is tried offline before the hub (so a cached GLUE works
  without a network); with ``HF_HUB_OFFLINE=1`` only the cache. Split
  ``validation`` by default (AX has only ``test``).
- ``.csv`` / ``.tsv`` / ``.parquet`` / ``.jsonl`` / ``.json``: read by
  ``datasets.load_dataset("csv" | "parquet" | "json", data_files=...)``.
  ``column`` names the text column (needed when there is more than one;
  JSON defaults to ``text``); ``"sentence1,sentence2"`` joins a sentence pair.
  A header-less CSV/TSV (the original CoLA TSVs) is addressed by 0-based
  column positions (``column="3"``). TSVs are read without quote handling, as
  GLUE's are. A file is one split: ``split`` is refused for files. A field
  holding a list or a dict (JSON), or an empty cell, is refused, naming the
  file, the line (row, record) and the value: its Python repr is no text.
  The identifiers come from ``id_column`` (default ``id``, else ``idx``, when
  the table has one; else the row numbers), and must be unique; a
  ``context_column`` (default ``context`` when the table has one) gives each
  text the context it is scored after (:func:`mptlml.mpt_curve` with
  ``context=``).
- ``.txt``: one sequence per line (a blank line is an error: empty sequence);
  ``.fasta`` / ``.fa``: one sequence per record (ids from the headers).

Sentence pairs (MRPC sentence1/sentence2, QNLI question/sentence, AX
premise/hypothesis, or several ``column`` names) are joined into one text
with a single space, so the pair is scored as one sequence of non-special tokens.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._optional import require
from .._validation import check_positive_int

__all__ = ["GLUE_FIELDS", "TextData", "bundled_antibodies", "load_texts"]

GLUE_FIELDS: dict[str, tuple[str, ...]] = {
    "ax": ("premise", "hypothesis"),
    "cola": ("sentence",),
    "sst2": ("sentence",),
    "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"),
}
_GLUE_ALIASES = {"sst-2": "sst2", "sst_2": "sst2"}


@dataclass
class TextData:
    """Texts with identifiers and a description of where they came from."""

    texts: list[str]
    ids: list[str]
    source: str
    #: one context per text (always visible, never scored), or None
    contexts: list[str] | None = None
    #: the column the contexts came from
    context_column: str | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def head(self, limit: int | None) -> TextData:
        """The first ``limit`` texts (all with None), with their ids and contexts."""
        if limit is None:
            return self
        ctx = None if self.contexts is None else self.contexts[:limit]
        return TextData(self.texts[:limit], self.ids[:limit], self.source, ctx,
                        self.context_column)


def bundled_antibodies(limit: int | None = None) -> TextData:
    """The bundled human IMGT germline V sequences (see ``data/README.md``)."""
    if limit is not None:
        limit = check_positive_int(limit, "limit")
    path = Path(__file__).with_name("antibody_germline_v.fasta")
    return _read_fasta(path).head(limit)


def _read_fasta(path: Path) -> TextData:
    ids: list[str] = []
    seqs: list[list[str]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith(">"):
                ids.append(line[1:].split()[0] if line[1:].split() else f"seq{len(ids)}")
                seqs.append([])
            elif not seqs:
                raise ValueError(f"{path} is not FASTA: sequence data before the first '>' "
                                 "header.")
            else:
                seqs[-1].append(line)
    texts = ["".join(s) for s in seqs]
    for i, t in enumerate(texts):
        if not t:
            raise ValueError(f"{path}: record {ids[i]!r} has an empty sequence; remove it.")
    return TextData(texts, ids, f"fasta:{path}")


def _load_dataset(*args: Any, **kwargs: Any) -> Any:
    """``datasets.load_dataset`` without progress bars."""
    require("datasets", "loading GLUE, .parquet or .jsonl texts")
    import datasets

    was_off = datasets.is_progress_bar_enabled() is False
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(*args, **kwargs)
    finally:
        if not was_off:
            datasets.enable_progress_bars()


def _glue(task: str, split: str | None) -> TextData:
    task = _GLUE_ALIASES.get(task.lower(), task.lower())
    if task not in GLUE_FIELDS:
        raise ValueError(f"unknown GLUE task {task!r}; choose one of {sorted(GLUE_FIELDS)}.")
    split = split or ("test" if task == "ax" else "validation")
    from ..models.hf_loading import hf_offline_mode, hub_offline

    try:
        with hf_offline_mode():  # cache first
            ds = _load_dataset("nyu-mll/glue", task, split=split)
    except (OSError, ValueError) as cached_exc:
        if hub_offline():
            raise ValueError(
                f"GLUE {task} ({split}) is not in the local datasets cache and HF_HUB_OFFLINE is "
                f"set ({type(cached_exc).__name__}). Load it once online, or pass a local file: "
                "--data cola.parquet/.tsv/.csv with --column sentence (or sentence1,sentence2)."
            ) from cached_exc
        try:
            ds = _load_dataset("nyu-mll/glue", task, split=split)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"GLUE {task} ({split}) is neither in the local datasets cache nor loadable from "
                f"the Hugging Face hub ({type(exc).__name__}: {_first_line(exc)}). Offline, set "
                "HF_HUB_OFFLINE=1 and pass a local file: --data cola.parquet/.tsv/.csv with "
                "--column sentence."
            ) from exc
    fields = GLUE_FIELDS[task]
    texts = [" ".join(str(row[f]) for f in fields) for row in ds]
    ids = [str(row.get("idx", i)) for i, row in enumerate(ds)]
    return TextData(texts, ids, f"glue:{task}:{split} (fields {'+'.join(fields)} joined by ' ')")


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


_BUILDERS = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".jsonl": "json",
             ".json": "json"}


def _table(path: Path, ext: str, column: str | None, id_column: str | None = None,
           context_column: str | None = None) -> TextData:
    """A CSV/TSV/parquet/JSON(L) table through ``datasets``; ``column`` may join several."""
    cols = [c.strip() for c in column.split(",") if c.strip()] if column else None
    kwargs: dict[str, Any] = {}
    if ext == ".tsv":
        kwargs.update(delimiter="\t", quoting=csv.QUOTE_NONE)
    if ext in (".csv", ".tsv") and cols and all(c.isdigit() for c in cols):
        kwargs["header"] = None  # header-less: columns by 0-based position
    try:
        ds = _load_dataset(_BUILDERS[ext], data_files=str(path), split="train", **kwargs)
    except Exception as exc:  # datasets raises many types for an unreadable file
        raise ValueError(f"cannot read {path} as {ext[1:]} ({type(exc).__name__}: "
                         f"{_first_line(exc)}).") from exc
    names = list(ds.column_names)
    if cols is None:
        if ext in (".jsonl", ".json") and "text" in names:
            cols = ["text"]
        elif len(names) == 1:
            cols = names
        else:
            raise ValueError(f"{path} has columns {names}; pass column=NAME (--column) to say "
                             "which holds the text (NAME1,NAME2 joins a sentence pair).")
    what = "field" if ext in (".jsonl", ".json") else "column"
    for c, flag in [*((c, "--column") for c in cols), (id_column, "--id-column"),
                    (context_column, "--context-column")]:
        if c is not None and c not in names:
            raise ValueError(f"{what} {c!r} not in {path} (has {names}); pass one of these with "
                             f"{flag}.")
    if id_column is None:
        id_column = next((c for c in ("id", "idx") if c in names and c not in cols), None)
    if context_column is None:
        context_column = "context" if "context" in names and "context" not in cols else None
    elif context_column in cols:
        raise ValueError(f"{what} {context_column!r} is both the text (--column) and the context "
                         "(--context-column); a context is never scored: pass two columns.")
    values = [ds[c] for c in cols]
    texts = []
    unit = {".jsonl": "line", ".json": "record"}.get(ext, "row")
    for r, row in enumerate(zip(*values, strict=True)):
        for c, v in zip(cols, row, strict=True):
            if v is None or (isinstance(v, float) and math.isnan(v)):
                raise ValueError(f"{path}: {unit} {r + 1} has no field {c!r} (an empty cell); "
                                 "fill it or remove the row.")
            if isinstance(v, list | tuple | dict):
                shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
                raise ValueError(
                    f"{path}: {unit} {r + 1}, field {c!r} holds a {type(v).__name__} ({shown}), "
                    "not a text: its Python repr would be scored. Give one string per record "
                    "(join a list of sentences into one text), or name a text field with "
                    "--column.")
        texts.append(" ".join(str(v) for v in row))
    ids = [str(i) for i in range(len(texts))]
    if id_column is not None:
        ids = [str(v) for v in ds[id_column]]
        seen: dict[str, int] = {}
        for r, v in enumerate(ids):
            if v in seen:
                raise ValueError(f"{path}: {what} {id_column!r} repeats the id {v!r} ({unit}s "
                                 f"{seen[v] + 1} and {r + 1}); ids name one text each: make them "
                                 "unique, or pass another column with --id-column.")
            seen[v] = r
    contexts = None
    if context_column is not None:
        contexts = []
        for r, v in enumerate(ds[context_column]):
            if v is None or (isinstance(v, float) and math.isnan(v)) or isinstance(
                    v, list | tuple | dict):
                raise ValueError(f"{path}: {unit} {r + 1} has no text in the context {what} "
                                 f"{context_column!r} ({v!r}); give every row a context (an "
                                 "empty string for none), or drop the column.")
            contexts.append(str(v))
    source = f"{ext[1:]}:{path}:{'+'.join(cols)}"
    if context_column is not None:
        source += f" given {context_column}"
    return TextData(texts, ids, source, contexts, context_column)


def load_texts(source: str | Path, *, column: str | None = None, split: str | None = None,
               limit: int | None = None, id_column: str | None = None,
               context_column: str | None = None) -> TextData:
    """Load texts from a local file or ``glue:TASK``.

    Parameters
    ----------
    source : str or path
        A file (.txt, .csv, .tsv, .parquet, .jsonl, .json, .fasta/.fa) or ``glue:TASK``.
    column : str, optional
        Column (field) holding the text; ``"a,b"`` joins columns a and b with
        a space; 0-based positions (``"3"``) for a header-less CSV/TSV.
    split : str, optional
        GLUE split (default ``validation``; ``test`` for AX); refused for files.
    limit : int, optional
        Keep the first ``limit`` texts.
    id_column : str, optional
        Tables: the column of the identifiers (unique); default ``id``, else
        ``idx``, when present, else the row numbers.
    context_column : str, optional
        Tables: the column of each text's context (``TextData.contexts``);
        default ``context`` when present.

    Raises
    ------
    ValueError
        Unknown format, missing column/field or cell, blank line, missing
        file, ``split`` given for a file, GLUE neither cached nor reachable.
    """
    if limit is not None:
        limit = check_positive_int(limit, "limit")  # a negative limit is no slice
    s = str(source)
    table = Path(s).suffix.lower() in _BUILDERS and not s.lower().startswith("glue")
    for key, value in (("id_column", id_column), ("context_column", context_column)):
        if value is not None and not table:
            raise ValueError(f"{key}={value!r} (--{key.replace('_', '-')}) applies to a table "
                             f"(.csv/.tsv/.parquet/.jsonl/.json), not to {s}.")
    if s.lower().startswith("glue:") or s.lower().startswith("glue/"):
        data = _glue(s[5:], split)
    else:
        path = Path(s)
        if not path.is_file():
            raise ValueError(f"data file {path} does not exist; pass a .txt/.csv/.tsv/.parquet/"
                             ".jsonl/.fasta file or glue:TASK.")
        if split is not None:
            raise ValueError(f"split={split!r} (--split) applies to glue:TASK; a file is one "
                             f"split: pass the file of the split you want instead of {path}.")
        ext = path.suffix.lower()
        if ext in (".txt", ".text"):
            lines = path.read_text(encoding="utf-8").splitlines()
            while lines and not lines[-1].strip():
                lines.pop()
            for i, line in enumerate(lines):
                if not line.strip():
                    raise ValueError(f"{path}: line {i + 1} is blank (an empty sequence); "
                                     "remove blank lines.")
            data = TextData([ln.strip() for ln in lines], [str(i) for i in range(len(lines))],
                            f"txt:{path}")
        elif ext in _BUILDERS:
            data = _table(path, ext, column, id_column, context_column)
        elif ext in (".fasta", ".fa", ".faa"):
            data = _read_fasta(path)
        else:
            raise ValueError(f"unknown data format {ext!r} for {path}; use .txt, .csv, .tsv, "
                             ".parquet, .jsonl, .json or .fasta, or glue:TASK.")
    data = data.head(limit)
    if not data.texts:
        raise ValueError(f"no texts found in {source}.")
    return data
