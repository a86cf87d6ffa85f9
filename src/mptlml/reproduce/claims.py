"""One claim of the report: what is checked, the paper's statement, our number, and a status.

Every part's ``claims(results)`` (:class:`~.parts.Part`) returns a list of dicts built by
:func:`claim` (or :func:`quick_claim`), with keys ``claim``, ``paper``,
``ours``, ``holds`` (bool, or None when nothing was decided; kept for
compatibility) and ``status``, exactly one of :data:`STATUSES`:

``holds``
    our own run reproduces the paper's statement;
``fails``
    our own run, or a number re-derived from the authors' data, contradicts it;
``undecided``
    the run is too small to decide the claim either way: a claim that quick
    sizes cannot decide (:func:`quick_claim`; the full-size outcome from
    :func:`full_size_outcome` is shown beside it), or a statistical test whose
    difference is within its noise (the note says what budget would decide
    it). A check that is decidable at the run's size never gets this status;
``recomputed``
    a number re-derived offline from the authors' published data (e.g. the
    Table 2 areas from their ``bert_mpt_curves.csv``) agrees with the paper;
    nothing was re-run;
``not run``
    the check could not be made (e.g. BERT on GLUE without the Hugging Face
    hub, a data set that could not be loaded).

An optional ``note`` explains a status (why a claim fails, or why it was
not run); the report prints it beside the claim.
"""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Any

from .._markdown import md_cell

__all__ = ["FULL_SIZE_FILE", "STATUSES", "claim", "full_size_markdown", "full_size_outcome",
           "full_size_table", "full_size_table_from_report", "quick_claim", "status_of"]

#: the only statuses a claim may have, in the order the report counts them.
STATUSES: tuple[str, ...] = ("holds", "fails", "undecided", "recomputed", "not run")

#: the packaged outcome of every claim at full size (``mptlml reproduce all``), by part.
FULL_SIZE_FILE = "full_size_claims.json"


def claim(claim: str, paper: Any, ours: Any, holds: bool | None, *,
          recomputed: bool = False, note: str | None = None,
          undecided: str | None = None, key: str | None = None) -> dict[str, Any]:
    """A claim dict with its status.

    Parameters
    ----------
    claim : what is checked.
    paper : the paper's statement or number.
    ours : our number (or the reason the check was not run).
    holds : True or False when decided, None when the check was not run.
    recomputed : the number was re-derived from the authors' published data,
        not from a run of ours: a claim that holds is ``recomputed``; one that
        does not is still ``fails``.
    note : optional explanation shown beside the claim.
    undecided : when given, the run cannot decide the claim: the status is
        ``undecided`` whatever ``holds`` says (``holds`` becomes None), and
        this text (why, and what would decide it) leads the note.
    key : a stable name of the claim (kept as ``key``) for a claim whose text
        depends on the run (e.g. names the best of several models): the
        full-size table (:func:`full_size_outcome`) is keyed by it. By
        default the claim's text is its key.
    """
    if holds is not None:
        holds = bool(holds)  # a verdict, not a numpy bool
    status = _status(holds, recomputed)
    if undecided:
        holds, status = None, "undecided"
        note = undecided if not note else f"{undecided} {note}"
    out: dict[str, Any] = {"claim": claim, "paper": paper, "ours": ours, "holds": holds,
                           "status": status}
    if key:
        out["key"] = key
    if note:
        out["note"] = note
    return out


def quick_claim(results: dict[str, Any], part: str, why: str, claim_text: str,
                paper: Any, ours: Any, holds: bool | None, *, note: str | None = None,
                key: str | None = None) -> dict[str, Any]:
    """A claim that quick sizes cannot decide (e.g. training to within 1% in a few epochs).

    In full mode (``results["quick"]`` false or absent) this is :func:`claim`.
    In quick mode the status is ``undecided``, the note says ``why`` quick
    sizes cannot decide it and gives the full-size outcome published with the
    package (:func:`full_size_outcome`), which is also kept under
    ``full_size``. A claim whose check quick sizes *can* decide must use
    :func:`claim`, so that a broken check still fails in quick mode.
    """
    if not results.get("quick"):
        return claim(claim_text, paper, ours, holds, note=note, key=key)
    full = full_size_outcome(part, key or claim_text)
    if full is None:
        at_full = "no full-size outcome is published for it yet"
    else:
        at_full = (f"at full size ({full['date']}): {full['status']}, "
                   f"{full['ours']}")
    out = claim(claim_text, paper, ours, holds, note=note, key=key,
                undecided=f"Not decided at quick sizes ({why}); {at_full}.")
    out["full_size"] = full
    return out


@functools.lru_cache(maxsize=1)
def full_size_table() -> dict[str, Any]:
    """The packaged ``mptlml/data/full_size_claims.json``: every claim's outcome at full size.

    ``{"date", "machine", "command", "source", "claims": {part: {key:
    {"status", "ours", "date"?, "source"?}}}}`` where ``key`` is the claim's
    ``key`` or text; written by :func:`full_size_table_from_report` from the
    ``report.json`` of a full ``mptlml reproduce all`` run (an entry's own
    ``source`` says where it came from when not from that run).
    """
    text = files("mptlml.data").joinpath(FULL_SIZE_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def full_size_outcome(part: str, key: str) -> dict[str, Any] | None:
    """``{"status", "ours", "date"}`` of one claim at full size, or None if not published."""
    table = full_size_table()
    rec = table["claims"].get(part, {}).get(key)
    if rec is None:
        return None
    return {"status": rec["status"], "ours": rec["ours"],
            "date": rec.get("date", table["date"])}


def full_size_table_from_report(report: dict[str, Any], *, date: str, machine: str,
                                command: str = "mptlml reproduce all --out DIR",
                                notes: dict[str, str] | None = None) -> dict[str, Any]:
    """The full-size table from a full run's ``report.json`` (``mptlml report DIR``).

    Every claim's status, our number and note, by part, and each part's wall
    time (``notes``: what else ran beside a part, by name). Refuses a report
    of a quick or mixed run: only full sizes go in the table. Write the
    result to ``src/mptlml/data/full_size_claims.json``
    (``json.dumps(table, indent=1, ensure_ascii=False)``).

    Raises
    ------
    ValueError
        If ``report`` is not a report (not an object, or without ``claims``,
        ``parts`` or ``missing``), lists missing parts (the table stands for
        every part of ``reproduce all``), or is of a quick or mixed run.
    """
    rebuild = "rebuild it with `mptlml report DIR` from the run of `mptlml reproduce all`"
    if not isinstance(report, dict):
        raise ValueError(f"the report holds a JSON {type(report).__name__}, not a report "
                         f"object; {rebuild}.")
    if "mode" in report and report.get("mode") != "full":
        raise ValueError(f"the report is of a {report.get('mode')!r} run; the full-size table "
                         "takes a full run only (mptlml reproduce all without --quick).")
    lacking = [k for k in ("mode", "claims", "parts", "missing") if k not in report]
    if lacking:
        raise ValueError(f"the report has no {', '.join(lacking)}: it was not written by "
                         f"`mptlml report`; {rebuild}.")
    claims = report["claims"]
    if not isinstance(claims, list) or not claims or not all(
            isinstance(c, dict) and {"section", "claim", "status", "ours"} <= set(c)
            for c in claims):
        raise ValueError(f"the report's claims are {'empty' if claims == [] else 'malformed'} "
                         f"(each needs section, claim, status and ours); {rebuild}.")
    if report["missing"]:
        missing = [str(m) for m in report["missing"]]
        raise ValueError(f"the report lacks {len(missing)} part{'s' if len(missing) > 1 else ''}"
                         f" ({', '.join(missing)}); the full-size table stands for every part "
                         "of `mptlml reproduce all`: finish them (mptlml reproduce all --out "
                         "DIR --resume) and rebuild the report (mptlml report DIR).")
    out: dict[str, dict[str, Any]] = {}
    for c in report["claims"]:
        rec = {"status": c["status"], "ours": c["ours"]}
        if c.get("note"):
            rec["note"] = c["note"]
        out.setdefault(c["section"], {})[c.get("key") or c["claim"]] = rec
    parts = {p["name"]: {"wall_time_s": p["wall_time_s"], "git_commit": p.get("git_commit")}
             for p in report.get("parts", [])}
    for name, text in (notes or {}).items():
        if name not in parts:
            raise ValueError(f"a note for {name!r}, which is not a part of the report "
                             f"({', '.join(parts)}).")
        parts[name]["note"] = text
    return {"date": date, "machine": machine, "command": command,
            "source": "report.json of that full run", "parts": parts, "claims": out}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s" if m else f"{s} s"


def full_size_markdown(table: dict[str, Any]) -> str:
    """The full-size table as Markdown: each part's wall time and counts, then every claim.

    ``table`` is :func:`full_size_table` (or :func:`full_size_table_from_report`);
    the documentation's full-reproduction page holds exactly this text.
    """
    lines = [f"Run on {table['date']}, {table['machine']}: `{table['command']}`.", ""]
    parts = table.get("parts", {})
    notes = any(p.get("note") for p in parts.values())
    lines += ["| part | wall time | " + " | ".join(STATUSES) + " |" + (" conditions |" if notes
                                                                    else ""),
              "|---|---:|" + "---:|" * len(STATUSES) + ("---|" if notes else "")]
    total = 0.0
    names = list(table["claims"]) + [n for n in parts if n not in table["claims"]]
    for name in names:
        claims = table["claims"].get(name, {})
        counts = [sum(c["status"] == st for c in claims.values()) for st in STATUSES]
        part = parts.get(name, {})
        total += part.get("wall_time_s") or 0.0
        lines.append(f"| {name} | {_duration(part.get('wall_time_s'))} | "
                     + " | ".join(str(n) if n else "" for n in counts) + " |"
                     + (f" {md_cell(part.get('note') or '')} |" if notes else ""))
    if parts:
        lines.append(f"| **all** | **{_duration(total)}** |" + " |" * len(STATUSES)
                     + (" |" if notes else ""))
    for name, claims in table["claims"].items():
        lines += ["", f"#### {name}", "", "| claim | status | ours |", "|---|---|---|"]
        for key, c in claims.items():
            ours = md_cell(c["ours"]) + (f" *{md_cell(c['note'])}*" if c.get("note") else "")
            lines.append(f"| {md_cell(key)} | {c['status']} | {ours} |")
    return "\n".join(lines) + "\n"


def _status(holds: bool | None, recomputed: bool) -> str:
    if holds is None:
        return "not run"
    if not holds:
        return "fails"
    return "recomputed" if recomputed else "holds"


def status_of(c: dict[str, Any]) -> str:
    """The status of a claim dict (built by :func:`claim`).

    Raises ``ValueError`` on a missing status or one outside :data:`STATUSES`.
    """
    s = c.get("status")
    if s is None:
        raise ValueError(f"claim {c.get('claim')!r} has no status; build claims with "
                         "mptlml.reproduce.claims.claim(...).")
    if s not in STATUSES:
        raise ValueError(f"claim {c.get('claim')!r} has status {s!r}; a status is one of "
                         f"{', '.join(STATUSES)}.")
    return str(s)
