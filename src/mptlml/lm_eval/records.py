"""The Monte Carlo side of an lm-eval run: one record per request, and how much is noise.

lm-eval logs each request's response (``resps``) but has no place for its
uncertainty, and its metric standard errors are bootstrapped over documents
(perplexities get none). The MPT bound is a Monte Carlo estimate, so every
request here gets a record, written as one JSON line (``mc_log``, by default
``mptlml_monte_carlo_<date>.jsonl`` beside lm-eval's ``--output_path``):

``task, doc_id, idx``
    lm-eval's keys of the request (join with its logged samples on them).
``request``
    ``"loglikelihood"`` or ``"loglikelihood_rolling"``.
``loglikelihood, stderr``
    The MPT bound of log p(continuation | context) (of the text, for rolling)
    and its Monte Carlo standard error.
``masked_inputs``
    The cost: masked inputs scored for the request.
``num_tokens, context_tokens, context_tokens_dropped``
    T and C of the scored pair (tokens), and the context tokens cut on the left
    to fit the model's length (lm-eval's causal models cut the same way).
``is_greedy``
    What was returned as ``is_greedy`` (:mod:`mptlml.lm_eval.greedy`); null when
    not computed (``greedy=false``).
``stderr_dof, rounds, stop_reason``
    Effective degrees of freedom of the standard error; rounds of draws;
    why drawing stopped (:func:`mptlml.compare`: ``"fixed"`` (no stop rule: the draws
    asked, one round or ``max_masks`` alone, spent whole), ``"target"``, ``"decided"``,
    ``"tied"``, ``"budget"`` (``max_masks`` spent first) or ``"exact"``;
    ``mptlml.estimators.sequential.STOP_REASONS``).
``exact``
    Whether the log-likelihood is an exact sum over every mask (a continuation
    of a few tokens: :data:`mptlml.estimators.compare.EXACT_LENGTH`); its
    standard error 0 is then exact.
``paired_stderr, question``
    For a multiple-choice document (K >= 2 candidates after one context): the
    standard error of (leader minus this candidate) on common masks, and the
    question: ``id``, ``choice`` (the leader's ``idx``), ``margin_z`` (the
    smallest (leader - other) / paired SE), ``z_threshold`` and ``decided``
    (``margin_z > z_threshold``: :func:`mptlml.compare`'s rule), ``flip_probability``
    (the chance the choice differs from the exhaustive one, :func:`flip_probability`),
    ``candidates``,
    ``masked_inputs`` (all candidates), ``rounds`` and ``stop_reason``.
``windows, words, bytes``
    Rolling requests: the windows scored, and lm-eval's word and byte counts of the text.
``continuation_chars``
    ``loglikelihood`` requests: the continuation's characters without its leading
    whitespace (the choice's, ``acc_norm``'s divisor).

:func:`summarize` turns the records of a run into what the run's metrics owe to
Monte Carlo noise, per task: the share of multiple-choice decisions not
decided, the Monte Carlo standard error of the accuracy (estimated by
sqrt(sum_q p_q (1 - p_q)) / Q, p_q = Phi(-margin_z_q) the chance that question
q's leader and its closest rival swap under a normal approximation centred on the
observed margin; the decision on the log-likelihoods themselves, lm-eval's ``acc``,
not ``acc_norm``'s length-normalised one). It is an estimate, not a bound: a swap
changes the accuracy only when one of the two is the gold answer (the estimate then
counts too much), but p_q is read off the observed margin, and near a tie that margin
is far from 0 more often than not: on exact ties margin_z is |N(0, 1)|, p_q is uniform
on (0, 1/2) and E[p_q (1 - p_q)] = 1/6 against the 1/4 of the coin the decision is, so
the estimate falls short of the spread over seeds by up to sqrt(2/3) = 0.82 (0.091
against 0.108 measured on 16 near ties at num_masks=4); past a true margin of about one
standard error it overstates it. And of the perplexities (the delta method on the summed
log-likelihood). It is the last line of the
file (``{"summary": ...}``) and goes into lm-eval's results
(``results["config"]["mptlml"]``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..estimators.results import MIN_STDERR_DOF
from ..estimators.sequential import merge_stops
from ..estimators.stats import sum_stderr

#: lm-eval's logger namespace: these lines show where lm-eval's own do
logger = logging.getLogger("lm_eval.mptlml")

__all__ = ["RecordLog", "add_monte_carlo_stderr", "check_log_path", "flip_probability",
           "group_weights", "pair_records", "rolling_records", "summarize", "summary_lines",
           "warn_summary", "warn_windows"]


def _phi(z: float) -> float:
    """Standard normal CDF."""
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def flip_probability(margin_z: float | None) -> float:
    """The chance a question's choice differs from the exhaustive one: ``Phi(-margin_z)``.

    The leader's lead over its closest rival, ``margin_z`` paired standard errors, read
    as the normal posterior of the true lead under a flat prior: the probability that the
    true lead has the other sign. Summed over questions it is the expected number of
    choices that differ from the exhaustive ones; it errs low on exact ties (the observed
    margin is ``|N(0, 1)|``: mean 1/4 where the coin is 1/2) and high on clear questions
    (module docstring). None or infinite (an exact or one-sided margin): 0.
    """
    if margin_z is None or not math.isfinite(margin_z):
        return 0.0
    return _phi(-float(margin_z))


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _plain(value: Any) -> Any:
    """``value`` with every non-finite float as null (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: the Monte Carlo standard errors of its metrics and the undecided decisions.

    Parameters
    ----------
    records : iterable of dict
        Request records (module docstring); other lines (a summary) are skipped.

    Returns
    -------
    dict
        task -> ``requests``, ``documents``, ``masked_inputs``, ``stderr_mean``,
        ``stderr_max`` (per request), ``budget_spent`` (requests that spent
        ``max_masks`` before their target or decision); with multiple-choice questions also
        ``questions``, ``undecided`` (neither decided nor stopped as a practical tie),
        ``tied`` (stopped within compare's indifference zone), ``undecided_share``,
        ``z_threshold``,
        ``accuracy_mc_stderr``;
        with single ``loglikelihood`` requests ``perplexity_mc_rel_stderr`` (of
        exp(-mean log-likelihood)); with rolling requests ``loglikelihood``
        (summed), ``loglikelihood_mc_stderr``, ``word_perplexity_mc_rel_stderr``,
        ``byte_perplexity_mc_rel_stderr`` (relative: SE(ppl) / ppl) and
        ``bits_per_byte_mc_stderr``.
    """
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if "request" in r:
            by_task[str(r["task"])].append(r)
    out: dict[str, dict[str, Any]] = {}
    for task, rs in sorted(by_task.items()):
        ses = [float(r["stderr"]) for r in rs]
        s: dict[str, Any] = {
            "requests": len(rs),
            "documents": len({r["doc_id"] for r in rs}),
            "masked_inputs": int(sum(int(r["masked_inputs"]) for r in rs)),
            "stderr_mean": sum(ses) / len(ses),
            "stderr_max": max(ses),
            "budget_spent": sum(r.get("stop_reason") == "budget" for r in rs),
        }
        questions = {r["question"]["id"]: r["question"] for r in rs if r.get("question")}
        if questions:
            norm = _norm_flips([r for r in rs if r.get("question")])
            flips = [flip_probability(q["margin_z"])  # null: an infinite margin (strict JSON)
                     for q in questions.values()]
            # a question stopped as a practical tie (compare's indifference zone) is settled
            tied = sum(bool(q.get("tied")) for q in questions.values())
            undecided = sum(not q["decided"] and not q.get("tied") for q in questions.values())
            s.update(questions=len(questions), undecided=undecided, tied=tied,
                     undecided_share=undecided / len(questions),
                     z_threshold=max(float(q["z_threshold"]) for q in questions.values()),
                     accuracy_mc_stderr=math.sqrt(sum(p * (1 - p) for p in flips))
                     / len(questions))
            if norm is not None:
                s["accuracy_norm_mc_stderr"] = math.sqrt(sum(p * (1 - p) for p in norm)) / len(
                    norm)
        single = [r for r in rs if r["request"] == "loglikelihood" and not r.get("question")]
        if single:
            var = sum(float(r["stderr"]) ** 2 for r in single)
            s["perplexity_mc_rel_stderr"] = math.sqrt(var) / len(single)
        rolling = [r for r in rs if r["request"] == "loglikelihood_rolling"]
        if rolling:
            se = math.sqrt(sum(float(r["stderr"]) ** 2 for r in rolling))
            words = sum(int(r["words"]) for r in rolling)
            nbytes = sum(int(r["bytes"]) for r in rolling)
            s.update(loglikelihood=sum(float(r["loglikelihood"]) for r in rolling),
                     loglikelihood_mc_stderr=se,
                     word_perplexity_mc_rel_stderr=se / words if words else math.nan,
                     byte_perplexity_mc_rel_stderr=se / nbytes if nbytes else math.nan,
                     bits_per_byte_mc_stderr=se / (nbytes * math.log(2)) if nbytes else math.nan)
        out[task] = s
    return out


def _norm_flips(records: list[dict[str, Any]]) -> list[float] | None:
    """Per question, the chance its ``acc_norm`` decision flips under Monte Carlo noise.

    lm-eval's ``acc_norm`` picks the largest log-likelihood per character of the
    continuation, ll_k / n_k. The leader's lead over candidate k then has a standard
    error of at most se_lead / n_lead + se_k / n_k whatever the masks' correlation (a
    bound: the paired error of common masks is smaller), and p = Phi(-min_k z_k), z_k
    the lead over that bound. None when the records lack ``continuation_chars``.
    """
    by_q: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_q[r["question"]["id"]].append(r)
    flips = []
    for rs in by_q.values():
        if any(not r.get("continuation_chars") for r in rs):
            return None
        v = [(float(r["loglikelihood"]) / r["continuation_chars"],
              float(r["stderr"]) / r["continuation_chars"]) for r in rs]
        lead = max(range(len(v)), key=lambda j: v[j][0])
        z = math.inf
        for j, (m, se) in enumerate(v):
            if j != lead:
                bound = v[lead][1] + se
                gap = v[lead][0] - m
                z = min(z, gap / bound if bound > 0 else (math.inf if gap > 0 else 0.0))
        flips.append(0.0 if math.isinf(z) else _phi(-z))
    return flips


def pair_records(keys: Sequence[Any], questions: Sequence[Sequence[int]], cmp: Any, *,
                 num_tokens: Sequence[int], context_tokens: Sequence[int],
                 dropped: Sequence[int], first_id: int) -> dict[Any, dict[str, Any]]:
    """The records of ``loglikelihood`` requests scored as questions (module docstring).

    Parameters
    ----------
    keys : list
        The requests, each with ``task``, ``doc_id``, ``idx`` and ``args`` (context,
        continuation).
    questions : list of list of int
        The positions in ``keys`` of each question's candidates, in order.
    cmp : Comparison
        :func:`mptlml.compare`'s result over ``questions``.
    num_tokens, context_tokens, dropped : list of int
        Per request: T, the context tokens scored, the context tokens cut to fit.
    first_id : int
        The ``id`` of the first question of several candidates minus 1 (ids run on
        over the run's calls).

    Returns
    -------
    dict
        key -> record (``is_greedy`` is added by the caller).
    """
    records: dict[Any, dict[str, Any]] = {}
    for q, members in enumerate(questions):
        k_q = len(members)
        question = None
        if k_q > 1:
            question = {
                "id": first_id + q + 1, "choice": keys[members[cmp.choice[q]]].idx,
                "decided": bool(cmp.decided[q]), "tied": str(cmp.stop_reason[q]) == "tied",
                "margin_z": float(cmp.margin_z[q]), "z_threshold": float(cmp.z_threshold[q]),
                "flip_probability": flip_probability(float(cmp.margin_z[q])),
                "candidates": k_q, "masked_inputs": int(cmp.num_masked_rows[q])}
        for j, i in enumerate(members):
            k = keys[i]
            records[k] = {
                "request": "loglikelihood", "task": k.task, "doc_id": k.doc_id, "idx": k.idx,
                "loglikelihood": float(cmp.scores[q][j]), "stderr": float(cmp.stderr[q][j]),
                "exact": bool(cmp.exact[q][j]),
                "masked_inputs": int(cmp.candidate_masked_rows[q][j]),
                "num_tokens": int(num_tokens[i]), "context_tokens": int(context_tokens[i]),
                "continuation_chars": len(k.args[1].lstrip()),
                "context_tokens_dropped": int(dropped[i]),
                "stderr_dof": float(cmp.stderr_dof[q]), "rounds": int(cmp.rounds[q]),
                "stop_reason": str(cmp.stop_reason[q])}
            if question is not None:
                records[k]["paired_stderr"] = float(cmp.paired_stderr[q][j])
                records[k]["question"] = question
    return records


def rolling_records(keys: Sequence[Any], num_tokens: Sequence[int], windows: Sequence[int],
                    cmp: Any) -> dict[Any, dict[str, Any]]:
    """The records of ``loglikelihood_rolling`` requests, each text the sum of its windows.

    ``cmp`` holds one question of one candidate per window, the windows of
    ``keys[0]`` first (``windows[i]`` of them for text i). A text's log-likelihood is
    the sum of its windows' and its standard error
    :func:`~mptlml.estimators.stats.sum_stderr` of theirs (independent masks:
    ``sqrt(sum_w se_w^2)``); it is exact when every window is.
    """
    ll = np.array([float(v[0]) for v in cmp.scores]) if len(cmp.scores) else np.zeros(0)
    se = np.array([float(v[0]) for v in cmp.stderr]) if len(cmp.stderr) else np.zeros(0)
    exact = [bool(v[0]) for v in cmp.exact]
    rows = [int(v) for v in cmp.num_masked_rows]
    stops = [str(v) for v in cmp.stop_reason]
    records: dict[Any, dict[str, Any]] = {}
    w = 0
    for k, t, n in zip(keys, num_tokens, windows, strict=True):
        text = k.args[0]
        records[k] = {
            "request": "loglikelihood_rolling", "task": k.task, "doc_id": k.doc_id,
            "idx": k.idx, "loglikelihood": float(ll[w:w + n].sum()),
            "stderr": float(sum_stderr(se[w:w + n])), "exact": all(exact[w:w + n]),
            "masked_inputs": sum(rows[w:w + n]), "num_tokens": int(t), "windows": n,
            "stop_reason": merge_stops(stops[w:w + n]),
            "words": len(re.split(r"\s+", text)), "bytes": len(text.encode("utf-8"))}
        w += n
    return records


#: lm-eval's metrics and the summary entry of their Monte Carlo standard error: absolute
#: (``"abs"``), or relative to the metric's value (``"rel"``, the perplexities)
_METRICS = {"acc": ("accuracy_mc_stderr", "abs"),
            "acc_norm": ("accuracy_norm_mc_stderr", "abs"),
            "perplexity": ("perplexity_mc_rel_stderr", "rel"),
            "word_perplexity": ("word_perplexity_mc_rel_stderr", "rel"),
            "byte_perplexity": ("byte_perplexity_mc_rel_stderr", "rel"),
            "bits_per_byte": ("bits_per_byte_mc_stderr", "abs")}


def group_weights(task_dict: Any) -> dict[str, dict[str, Any]]:
    """The groups of lm-eval's task dict, as lm-eval aggregates their metrics.

    Returns
    -------
    dict
        group -> ``{"tasks": [leaf task names], "weight_by_size": {metric: bool}}`` for every
        group whose YAML has an ``aggregate_metric_list`` (lm-eval's group row: the mean of
        its leaf tasks' metric, weighted by their sizes or not).
    """
    found: dict[str, dict[str, Any]] = {}
    groups = task_dict.get("groups", {}) if isinstance(task_dict, dict) else {}
    for name, group in groups.items():
        metrics = getattr(group, "aggregate_metric_list", None) or []
        if metrics and hasattr(group, "get_all_tasks"):
            found[str(getattr(group, "name", name))] = {
                "tasks": [str(t.task_name) for t in group.get_all_tasks()],
                "weight_by_size": {str(m.metric): bool(m.weight_by_size) for m in metrics}}
    return found


def _group_stderr(results: dict[str, Any], summary: dict[str, Any],
                  groups: dict[str, dict[str, Any]]) -> None:
    """Each group row's ``METRIC_mc_stderr,FILTER`` from its leaf tasks' (independent masks):
    ``sqrt(sum_i w_i^2 se_i^2) / sum_i w_i``, ``w_i`` the task's documents when the group
    weights by size, else 1, as lm-eval weights the metric itself."""
    rows = results.get("results", {})
    for group, g in groups.items():
        for metric, by_size in g["weight_by_size"].items():
            for key in [k for k in rows.get(group, {}) if k.partition(",")[0] == metric]:
                filt = key.partition(",")[2]
                mc = [rows.get(t, {}).get(f"{metric}_mc_stderr,{filt}") for t in g["tasks"]]
                if not g["tasks"] or any(v is None or t not in summary
                                         for v, t in zip(mc, g["tasks"], strict=True)):
                    continue
                w = [float(summary[t]["documents"]) if by_size else 1.0 for t in g["tasks"]]
                se = math.sqrt(sum((wi * v) ** 2 for wi, v in zip(w, mc, strict=True))) / sum(w)
                for table in (rows, results.get("groups", {})):
                    if group in table:
                        table[group][f"{metric}_mc_stderr,{filt}"] = se


def add_monte_carlo_stderr(results: dict[str, Any], model: Any = None) -> dict[str, Any]:
    """Put each metric's Monte Carlo standard error beside lm-eval's own, in ``results``.

    For every task of ``results["results"]`` that the run's summary
    (``results["config"]["mptlml"]["monte_carlo"]``, :func:`summarize`) covers, and
    every metric key ``"METRIC,FILTER"`` with a Monte Carlo error, adds
    ``"METRIC_mc_stderr,FILTER"``: ``acc`` and ``acc_norm`` (the decisions' flips,
    :func:`summarize`), the perplexities by the delta method (``perplexity``,
    ``word_perplexity``, ``byte_perplexity``: value * SE(log-likelihood sum) / count)
    and ``bits_per_byte`` (SE / (bytes ln 2)); and on each group row (an mmlu-style
    ``group:`` YAML with ``aggregate_metric_list``) the same mean of its tasks' as lm-eval
    takes of the metric (:func:`group_weights`). lm-eval's ``METRIC_stderr`` is over
    documents; this one is what the masks' randomness adds, at these documents.
    :func:`mptlml.lm_eval.main` calls it; call it on the result of
    ``lm_eval.simple_evaluate(model="mptlml", ...)``.

    Parameters
    ----------
    results : dict
        lm-eval's results.
    model : MPTLM, optional
        The model of the run. lm-eval versions that ask only their own ``hf`` model for
        its info (0.4.8) leave ``results["config"]["mptlml"]`` out: given the model, its
        run's summary (``model.get_model_info()``) is put there first.

    Returns
    -------
    dict
        ``results``, changed in place.
    """
    config = results.setdefault("config", {})
    if model is not None and "mptlml" not in config:
        config.update(model.get_model_info())
    summary = config.get("mptlml", {}).get("monte_carlo") or {}
    for task, metrics in results.get("results", {}).items():
        s = summary.get(task)
        if not s:
            continue
        for key, value in list(metrics.items()):
            metric, sep, filt = key.partition(",")
            if metric not in _METRICS or not sep or not _finite(value):
                continue
            name, kind = _METRICS[metric]
            if name not in s or not _finite(s[name]):
                continue
            se = float(s[name]) * (abs(float(value)) if kind == "rel" else 1.0)
            metrics[f"{metric}_mc_stderr,{filt}"] = se
    _group_stderr(results, summary, config.get("mptlml", {}).get("groups") or {})
    return results


def summary_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    """One line per task saying what its metrics owe to Monte Carlo noise (for the log)."""
    lines = []
    for task, s in summary.items():
        parts = [f"{task}: {s['requests']} requests, {s['masked_inputs']:,} masked inputs, "
                 f"per-request MC stderr mean {s['stderr_mean']:.3g} (max {s['stderr_max']:.3g})"]
        if s["budget_spent"]:
            parts.append(f"{s['budget_spent']} requests spent max_masks (masked inputs) before "
                         "their target")
        if "questions" in s:
            parts.append(f"{s['undecided']}/{s['questions']} multiple-choice decisions "
                         f"({100 * s['undecided_share']:.1f}%) not decided at "
                         f"{s['z_threshold']:.3g} paired SE; accuracy MC stderr <= "
                         f"{s['accuracy_mc_stderr']:.3g}")
        if "perplexity_mc_rel_stderr" in s:
            parts.append(f"perplexity MC stderr {100 * s['perplexity_mc_rel_stderr']:.3g}% "
                         "of its value")
        if "loglikelihood_mc_stderr" in s:
            parts.append(f"summed log-likelihood {s['loglikelihood']:.6g} +/- "
                         f"{s['loglikelihood_mc_stderr']:.3g} (MC); word perplexity MC stderr "
                         f"{100 * s['word_perplexity_mc_rel_stderr']:.3g}% of its value, "
                         f"bits per byte +/- {s['bits_per_byte_mc_stderr']:.3g}")
        lines.append("; ".join(parts))
    return lines


def check_log_path(path: Path | None) -> None:
    """Refuse a Monte Carlo log that could not be written, naming ``mc_log`` (nothing made)."""
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"model_args mc_log={path} is a directory; pass the path of a "
                         "JSON-lines file (or leave it out: --output_path's directory).")
    where = path.parent
    while not where.exists() and where != where.parent:  # made on the first write
        where = where.parent
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK) or (
            path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"model_args mc_log={path} cannot be written ({where} is not a "
                         "writable directory); pass a path in a writable directory.")


class RecordLog:
    """The records of a run, kept in memory and (on the main process) written as JSON lines.

    Parameters
    ----------
    path : path, optional
        The JSON-lines file; created (or emptied) on the first write. None: in memory only.
    write : bool
        Whether this process writes (the main rank does; the others keep records only).
    """

    def __init__(self, path: str | os.PathLike | None, *, write: bool = True) -> None:
        self.path = None if path is None else Path(path)
        self.write = bool(write) and self.path is not None
        if self.write and self.path is not None:  # made here, before any request is scored
            check_log_path(self.path)
            self._create(self.path)
        self.records: list[dict[str, Any]] = []
        #: the records and summary of the run :meth:`close_run` closed
        self.finished: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None = None

    @staticmethod
    def _create(path: Path) -> None:
        """Create ``path`` empty, exclusively (``O_EXCL``): a file that exists, an earlier or
        a concurrent run's, is refused, so no run's records are lost or mixed."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("x", encoding="utf-8"):
                pass
        except FileExistsError:
            raise FileExistsError(
                f"mc_log {path} exists (another run's records, finished or running): one file "
                "holds one run; pass a new path, or remove that file first.") from None
        except OSError as exc:
            raise ValueError(f"model_args mc_log={path} cannot be created ({exc.strerror}); "
                             "pass a path in a writable directory.") from None

    def _append(self, lines: list[dict[str, Any]]) -> None:
        if not self.write or self.path is None:
            return
        with self.path.open("a", encoding="utf-8") as f:
            for r in lines:
                f.write(json.dumps(_plain(r), allow_nan=False) + "\n")

    def check_open(self) -> None:
        """Refuse a second run into a file that holds a finished one (before any scoring)."""
        if self.finished is not None and self.path is not None:
            raise RuntimeError(
                f"mc_log {self.path} holds a finished run: one file holds one run. Build a new "
                "MPTLM (or pass a new mc_log) for the next evaluation.")

    def add(self, records: list[dict[str, Any]]) -> None:
        """Keep (and write) the records of one batch of requests."""
        self.check_open()
        self.records.extend(records)
        self._append(records)

    @classmethod
    def dump(cls, path: str | os.PathLike, records: list[dict[str, Any]],
             summary: dict[str, dict[str, Any]]) -> None:
        """Write a finished run (its records, then its summary) to a new file ``path``."""
        log = cls(path)
        log._append([*records, {"summary": summary}])

    def close_run(self) -> dict[str, dict[str, Any]]:
        """The summary of the records since the last call; written as the file's last line."""
        summary = summarize(self.records)
        self._append([{"summary": summary}])
        self.finished = (self.records, summary)
        self.records = []
        return summary


def warn_summary(summary: dict[str, dict[str, Any]], settings: Any) -> None:
    """Log a run's summary (:func:`summary_lines`), and warn of what it did not settle:
    requests that spent ``max_masks`` before their target or decision, and undecided
    multiple-choice decisions (``settings``: the run's
    :class:`~mptlml.lm_eval.settings.RunSettings`)."""
    for line in summary_lines(summary):
        logger.info("Monte Carlo: %s", line)
    for task, s in summary.items():
        if s["budget_spent"] and (settings.target_se is not None or settings.decide):
            logger.warning(
                "%s: %d requests spent %s before reaching %s; their standard errors are in "
                "the Monte Carlo log. Raise max_masks.", task, s["budget_spent"],
                f"max_masks={settings.max_masks} masked inputs" if settings.max_masks else
                "mptlml.compare's default cap (128 masked inputs with decide, 512 draws with "
                "target_se)", "target_se" if settings.target_se is not None else "a decision")
        if s.get("undecided"):
            logger.warning(
                "%s: %d of %d multiple-choice decisions are not decided (the leader is not "
                "ahead of every other candidate by %.3g paired standard errors): Monte Carlo "
                "noise can move its accuracy by up to %.3g. More masks (decide=true, a larger "
                "max_masks) decide them.", task, s["undecided"], s["questions"],
                s["z_threshold"], s["undecided_share"])


def warn_windows(cmp: Any) -> None:
    """Warn, in one line, of the text windows of a perplexity task whose standard errors are
    not settled (``cmp``: :func:`mptlml.compare`'s result, one window per question): those
    that spent ``max_masks`` before their target, those with a standard error 0 that is not
    exact, and those on fewer than :data:`~mptlml.estimators.results.MIN_STDERR_DOF` dof."""
    n = len(cmp.stderr)
    cases = [([w for w in range(n) if cmp.stop_reason[w] == "budget"],
              "spent max_masks before their target (raise max_masks)"),
             ([w for w in range(n) if cmp.stderr[w][0] == 0 and not cmp.exact[w][0]],
              "with a standard error 0 that is not exact (draws on one mask)"),
             ([w for w in range(n) if cmp.stderr_dof[w] < MIN_STDERR_DOF],
              f"with fewer than {MIN_STDERR_DOF} dof (an error beyond 2 SE is then far more "
              "frequent than 5%)")]
    said = [f"{len(ws)} of {n} text windows {what}" for ws, what in cases if ws]
    if said:
        warnings.warn(f"loglikelihood_rolling: {'; '.join(said)}; more masks (num_masks, or "
                      "target_se=) settle them.", RuntimeWarning, stacklevel=3)
