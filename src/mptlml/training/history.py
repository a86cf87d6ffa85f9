"""The record of a training run: per-epoch values, settings, and their CSV / JSON files."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._io import atomic_write_text, jsonable
from .._optional import require

__all__ = ["HISTORY_FORMAT", "History"]

#: version of the JSON layout written by :meth:`History.to_json`.
HISTORY_FORMAT = 1


@dataclass
class History:
    """Per-epoch records of a training run.

    Attributes
    ----------
    records : list of dict
        One dict per recorded epoch (epoch 0 = initial parameters), with keys
        ``epoch``, ``objective``, ``time_s`` and one per monitor (``name`` or
        ``name/key``); a monitor not due at an epoch is absent from its record.
    meta : dict
        Settings of the run (objective, optimizer, lr, epochs, seed, ...).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        """Every key that appears in some record, in first-seen order."""
        cols: dict[str, None] = {}
        for r in self.records:
            for k in r:
                cols.setdefault(k, None)
        return list(cols)

    def column(self, name: str) -> list[Any]:
        """Values of ``name`` over the records (``None`` where it was not recorded)."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r} in the history; columns: {self.columns}.")
        return [r.get(name) for r in self.records]

    def series(self, name: str) -> tuple[list[int], list[Any]]:
        """``(epochs, values)`` of the records where ``name`` was recorded."""
        vals = self.column(name)
        pairs = [(r["epoch"], v) for r, v in zip(self.records, vals, strict=True) if v is not None]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def last(self) -> dict[str, Any]:
        """The final record."""
        if not self.records:
            raise ValueError("the history is empty.")
        return self.records[-1]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dictionary."""
        return {"format": HISTORY_FORMAT, "meta": jsonable(self.meta),
                "records": jsonable(self.records)}

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the history (records and meta) to a JSON file, atomically."""
        p = Path(path)
        atomic_write_text(p, json.dumps(self.to_dict(), indent=1) + "\n")
        return p

    def to_pandas(self, columns: Sequence[str] | None = None) -> Any:
        """A ``pandas.DataFrame`` with one row per recorded epoch (missing values None/NaN).

        Columns are :attr:`columns` (or ``columns``); a monitor that returns a
        list (e.g. a curve) keeps it as one cell.
        """
        require("pandas", "History.to_pandas()")
        import pandas as pd

        cols = list(columns) if columns is not None else self.columns
        return pd.DataFrame([jsonable(r) for r in self.records], columns=cols, dtype=object)

    def csv_text(self, columns: Sequence[str] | None = None) -> str:
        """The records as CSV text (non-scalar values JSON-encoded, missing ones empty)."""
        df = self.to_pandas(columns).map(
            lambda v: json.dumps(v) if isinstance(v, list | dict) else v)
        return df.to_csv(index=False, lineterminator="\n")

    def to_csv(self, path: str | os.PathLike, columns: Sequence[str] | None = None) -> Path:
        """Write the records as CSV, atomically (meta is not stored; use :meth:`to_json`)."""
        p = Path(path)
        atomic_write_text(p, self.csv_text(columns))
        return p

    @classmethod
    def load(cls, path: str | os.PathLike) -> History:
        """Read a history written by :meth:`to_json` (``.json``) or :meth:`to_csv` (``.csv``)."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no history file at {p}.")
        if p.suffix.lower() == ".csv":
            return cls(records=[_parse_csv_row(r) for r in csv.DictReader(io.StringIO(
                p.read_text()))])
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p} is not valid JSON ({exc}).") from exc
        if not isinstance(data, dict) or "records" not in data:
            raise ValueError(f"{p} is not a training history (no 'records'); write it with "
                             "History.to_json.")
        if int(data.get("format", 0)) > HISTORY_FORMAT:
            raise ValueError(f"{p} has history format {data.get('format')}, newer than this "
                             f"mptlml reads ({HISTORY_FORMAT}); upgrade mptlml.")
        return cls(records=list(data["records"]), meta=dict(data.get("meta", {})))


def _parse_csv_row(row: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if v == "":
            continue
        try:
            val: Any = json.loads(v)
        except json.JSONDecodeError:
            val = v
        out[k] = int(val) if k == "epoch" else val
    return out
