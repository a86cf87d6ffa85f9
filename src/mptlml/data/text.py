"""Text loaders for masked-LM scoring: GLUE via Hugging Face ``datasets``, local files.

Local formats (by extension):

- ``.txt``: one sequence per line (a blank line is an error: empty sequence);
- ``.csv`` / ``.tsv``: a header row; ``column`` names the text column
  (required when there is more than one column);
- ``.jsonl``: one JSON object per line; ``column`` names the field (default ``text``);
- ``.fasta`` / ``.fa``: one sequence per record (ids from the headers).

GLUE (``glue:cola``, ``glue:sst2``, ``glue:mrpc``, ``glue:qnli``, ``glue:ax``)
needs the Hugging Face hub. Split: ``validation`` by default (AX has only
``test``). Sentence pairs (MRPC sentence1/sentence2, QNLI question/sentence,
AX premise/hypothesis) are joined into one text with a single space, so the
pair is scored as one sequence of non-special tokens.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

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

    def __len__(self) -> int:
        return len(self.texts)


def bundled_antibodies(limit: int | None = None) -> TextData:
    """The bundled human IMGT germline V sequences (see ``data/README.md``)."""
    if limit is not None:
        limit = check_positive_int(limit, "limit")
    path = Path(__file__).with_name("antibody_germline_v.fasta")
    data = _read_fasta(path)
    if limit is not None:
        data = TextData(data.texts[:limit], data.ids[:limit], data.source)
    return data


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


def _glue(task: str, split: str | None) -> TextData:
    task = _GLUE_ALIASES.get(task.lower(), task.lower())
    if task not in GLUE_FIELDS:
        raise ValueError(f"unknown GLUE task {task!r}; choose one of {sorted(GLUE_FIELDS)}.")
    split = split or ("test" if task == "ax" else "validation")
    from ..models.masked_lm import hub_reachable

    if not hub_reachable():
        raise ValueError(
            f"GLUE {task} needs the Hugging Face hub, which is not reachable. Offline, pass a "
            "local file instead (--data texts.txt, or a CSV/TSV/JSONL with --column)."
        )
    import datasets

    ds = datasets.load_dataset("nyu-mll/glue", task, split=split)
    fields = GLUE_FIELDS[task]
    texts = [" ".join(str(row[f]) for f in fields) for row in ds]
    ids = [str(row.get("idx", i)) for i, row in enumerate(ds)]
    return TextData(texts, ids, f"glue:{task}:{split} (fields {'+'.join(fields)} joined by ' ')")


def load_texts(source: str | Path, *, column: str | None = None, split: str | None = None,
               limit: int | None = None) -> TextData:
    """Load texts from a local file or ``glue:TASK``.

    Parameters
    ----------
    source : str or path
        A file (.txt, .csv, .tsv, .jsonl, .fasta/.fa) or ``glue:TASK``.
    column : str, optional
        CSV/TSV column or JSONL field holding the text.
    split : str, optional
        GLUE split (default ``validation``; ``test`` for AX).
    limit : int, optional
        Keep the first ``limit`` texts.

    Raises
    ------
    ValueError
        Unknown format, missing column/field, blank line, missing file.
    """
    if limit is not None:
        limit = check_positive_int(limit, "limit")  # a negative limit is no slice
    s = str(source)
    if s.lower().startswith("glue:") or s.lower().startswith("glue/"):
        data = _glue(s[5:], split)
    else:
        path = Path(s)
        if not path.is_file():
            raise ValueError(f"data file {path} does not exist; pass a .txt/.csv/.tsv/.jsonl/"
                             ".fasta file or glue:TASK.")
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
        elif ext in (".csv", ".tsv"):
            with open(path, newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f, delimiter="\t" if ext == ".tsv" else ",")
                rows = list(reader)
                cols = reader.fieldnames or []
            if column is None:
                if len(cols) != 1:
                    raise ValueError(f"{path} has columns {cols}; pass column=NAME (--column) "
                                     "to say which holds the text.")
                column = cols[0]
            if column not in cols:
                raise ValueError(f"column {column!r} not in {path} (columns: {cols}); pass one "
                                 "of these with --column.")
            data = TextData([r[column] or "" for r in rows], [str(i) for i in range(len(rows))],
                            f"{ext[1:]}:{path}:{column}")
        elif ext == ".jsonl":
            field = column or "text"
            texts = []
            with open(path, encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    obj = json.loads(line)
                    if not isinstance(obj, dict) or field not in obj:
                        keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
                        raise ValueError(f"{path}: line {n} has no field {field!r} (has {keys});"
                                         " pass the field name with --column.")
                    texts.append(str(obj[field]))
            data = TextData(texts, [str(i) for i in range(len(texts))], f"jsonl:{path}:{field}")
        elif ext in (".fasta", ".fa", ".faa"):
            data = _read_fasta(path)
        else:
            raise ValueError(f"unknown data format {ext!r} for {path}; use .txt, .csv, .tsv, "
                             ".jsonl or .fasta, or glue:TASK.")
    if limit is not None:
        data = TextData(data.texts[:limit], data.ids[:limit], data.source)
    if not data.texts:
        raise ValueError(f"no texts found in {source}.")
    return data
