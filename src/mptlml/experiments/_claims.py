"""One claim of the report: what is checked, the paper's statement, our number, and a status.

Every experiment's ``claims(results)`` returns a list of dicts built by
:func:`claim`, with keys ``claim``, ``paper``, ``ours``, ``holds`` (bool, or
None when nothing was decided; kept for compatibility) and ``status``, exactly
one of :data:`STATUSES`:

``holds``
    our own run reproduces the paper's statement;
``fails``
    our own run, or a number re-derived from the authors' data, contradicts it;
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

from typing import Any

__all__ = ["STATUSES", "claim", "status_of"]

#: the only statuses a claim may have, in the order the report counts them.
STATUSES: tuple[str, ...] = ("holds", "fails", "recomputed", "not run")


def claim(claim: str, paper: Any, ours: Any, holds: bool | None, *,
          recomputed: bool = False, note: str | None = None) -> dict[str, Any]:
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
    """
    if holds is not None:
        holds = bool(holds)  # a verdict, not a numpy bool
    out: dict[str, Any] = {"claim": claim, "paper": paper, "ours": ours, "holds": holds,
                           "status": _status(holds, recomputed)}
    if note:
        out["note"] = note
    return out


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
                         "mptlml.experiments._claims.claim(...).")
    if s not in STATUSES:
        raise ValueError(f"claim {c.get('claim')!r} has status {s!r}; a status is one of "
                         f"{', '.join(STATUSES)}.")
    return str(s)
