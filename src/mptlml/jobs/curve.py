"""``mptlml curve``: MPT curves of masked LMs on texts, written to a run directory.

The job :data:`JOB` (:class:`CurveConfig`, :func:`load_curve`,
:func:`run_curve`) scores one model; the parts ``antibody`` and ``bert`` of
:mod:`mptlml.reproduce` score several with the same pieces
(:func:`score_models`, :func:`write_curves`). All three take the settings of
:class:`MLMRunConfig`. Files:

- ``curve.csv``: model (its name), weights (``pretrained`` or ``random_init``),
  rate, mean log-prob of the masked tokens, standard error;
- ``per_sequence.csv``: model, weights, id, D_i, LML estimate D_i * mean_k S_ik
  (and the cumulative estimate when computed), PLL when computed; with
  contexts (a conditional curve, log p(x_T | x_C)), a ``context`` column;
- ``pll_tokens.csv`` (with the PLL, unconditional runs): model, weights and the
  columns of :meth:`~mptlml.estimators.results.TokenScores.to_pandas` (datum,
  id, position, token, log_prob, word for word-level runs, variant, unit), one
  row per token (per word with whole-word masking);
- ``mpt_curve.png/.pdf``: the curves with +-1 standard error bands;
- ``checkpoint/``: finished chunks, so an interrupted run resumes (``--resume``);
  listed in results.json's ``files``.

With ``--target-se`` the masks are drawn in rounds of the sequential engine
(:mod:`mptlml.estimators.sequential`: doubling, no pilot) until the Monte Carlo
standard error of the mean LML is at the target, ``--max-masks`` bounds them
(refused before any draw past ``mptlml.settings.max_masked_inputs``), and
results.json and the printed summary give that standard error, the target and
``stop_reason`` (``target`` or ``budget``).

Under ``torchrun``/``accelerate launch`` every process scores its share of
the sequences on its own device and only rank 0 writes the result files.
``results.json`` records each model's device, dtype and autocast and the
world size.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .._scoring.distributed import distributed_context, resolve_device
from .._validation import MIN_TARGET_SE
from ..estimators import MPTCurve, mpt_curve, pll
from ..estimators.plots import plot_curves
from ..estimators.rates import check_rates, rate_grid, rate_widths
from ..models.conditional import with_context
from ..models.masked_lm import MaskedLM
from ..runs.config import RunConfig, setting
from ..runs.job import Job
from ..runs.output import can_draw, pyplot
from ..runs.rundir import RunDir

__all__ = ["DEVICE_SETTINGS", "JOB", "CurveConfig", "CurveInputs", "MLMRunConfig",
           "curve_summary",
           "load_curve", "load_model", "parse_rates", "run_curve",
           "score_models", "write_curves", "write_pll_tokens"]

_log = logging.getLogger(__name__)


@dataclass
class MLMRunConfig(RunConfig):
    """The settings of a masked-LM run, declared once for ``curve``, ``antibody`` and ``bert``.

    What is scored (rates, masks, seed, the area's L, the extra estimates) and
    where and how (device, dtype, autocast, batch sizes). Each is a ``--set``
    key of the reproductions and a flag of ``mptlml curve`` (``num_masks``,
    ``--num-masks``); a job that needs another default re-declares it with
    :func:`~mptlml.runs.config.redefault`. The device, dtype and autocast that actually
    ran are recorded per model in results.json, with the world size.
    """

    num_sequences: int | None = setting(None, "score the first N sequences (default: all)",
                                        min=1)
    rates: str = setting("0.01:0.99:0.01", "masking rates: START:STOP:STEP (inclusive) or a "
                         "comma list (the paper: 0.01:0.99:0.01)")
    num_masks: int = setting(1, "P, masks per rate and sequence", min=1)
    seed: int = setting(0, "seed of the masks", min=0)
    nominal_length: float | None = setting(None, "L of the area (L/100) * sum (the paper: 512; "
                                           "none: the mean sequence length)", gt=0)
    cumulative: bool = setting(False, "also the cumulative estimate, the sum over M = 1..D_i "
                               "of P masks each (D_i*P pairs)")
    pll: bool = setting(False, "also the pseudo-log-likelihood, per token in pll_tokens.csv")
    pll_variant: str = setting("original", "PLL masking: one token at a time, or word_l2r "
                               "(Kauf & Ivanova 2023: a word's later sub-tokens masked too)",
                               choices=("original", "word_l2r"))
    whole_word: bool = setting(False, "mask whole words (the fast tokenizer's word_ids), curve "
                               "and PLL: D_i counts words")
    corruption: str = setting("mask", "pure [MASK], or BERT's 80/10/10",
                              choices=("mask", "bert"))
    truncate: bool = setting(False, "cut sequences longer than the model maximum instead of "
                             "failing")
    token_budget: int = setting(8192, "padded tokens per forward pass", min=1, execution=True)
    chunk_size: int = setting(8, "sequences per checkpointed chunk (--resume)", min=1,
                              execution=True)
    batch_size: int | None = setting(None, "most sequences per forward pass, beside "
                                     "token_budget (default: as many as the budget allows)",
                                     min=1, execution=True)
    device: str | None = setting(None, "torch device: cpu, cuda, cuda:1, ... (default: the "
                                 "rank's CUDA device when available, else cpu; under torchrun "
                                 "each rank takes cuda:LOCAL_RANK)", execution=True)
    dtype: str | None = setting(None, "model dtype (default: the checkpoint's)",
                                choices=("float32", "float16", "bfloat16", "float64"))
    autocast: bool | None = setting(None, "mixed-precision forward (bfloat16; float16 on GPUs "
                                    "without it; default: off)")
    progress: bool = setting(True, "progress bars (off anyway with --quiet or TQDM_DISABLE=1)",
                             execution=True)

    def rate_grid(self) -> np.ndarray:
        """The masking rates of ``rates`` (:func:`parse_rates`), checked."""
        return check_rates(parse_rates(self.rates))

    def validate(self) -> None:
        """The rates parse; a PLL variant needs the PLL and masks tokens, not whole words."""
        super().validate()
        self.rate_grid()
        if self.pll_variant != "original" and not self.pll:
            raise ValueError(f"pll_variant {self.pll_variant} applies to the PLL; add --pll "
                             "(pll=true).")
        if self.pll_variant != "original" and self.whole_word:
            raise ValueError(f"--whole-word masks each word's sub-tokens together (the curve "
                             f"and the PLL), but --pll-variant {self.pll_variant} scores them "
                             "one by one: pass one of the two (whole_word=true or "
                             f"pll_variant={self.pll_variant}).")


#: the settings of :class:`MLMRunConfig` that say where and how a model runs
#: (``mptlml reproduce`` takes them as flags too: ``--device``, ``--dtype``, ...).
DEVICE_SETTINGS = ("device", "dtype", "autocast", "batch_size")


def parse_rates(text: str | None) -> np.ndarray | None:
    """``"0.01:0.99:0.01"`` (start:stop:step, inclusive) or ``"0.1,0.5,0.9"``; None: default."""
    if text is None:
        return None
    try:
        if ":" in text:
            a, b, s = (float(v) for v in text.split(":"))
        else:
            return np.array([float(v) for v in text.split(",") if v.strip()])
    except ValueError as exc:
        raise ValueError(f"cannot read rates {text!r}; pass START:STOP:STEP (e.g. "
                         "0.01:0.99:0.01) or a comma list (e.g. 0.15,0.5).") from exc
    try:
        return rate_grid(a, s, stop=b)
    except ValueError as exc:  # readable, but not a grid of rates in (0, 1)
        raise ValueError(f"rates {text!r}: {exc}") from exc


def score_models(models: Mapping[str, MaskedLM], texts: Sequence[str], cfg: MLMRunConfig, *,
                 run_dir: RunDir, ids: list[str] | None = None,
                 contexts: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Curve (and, with ``cfg.pll``, PLL) of each model; checkpoints under ``run_dir/checkpoint``.

    Every setting of the scoring comes from ``cfg`` (:class:`MLMRunConfig`;
    ``target_se`` and ``max_masks`` when it has them). Each entry also holds
    ``placement``: the model's device, dtype, autocast and the world size,
    which :func:`write_curves` records; with the PLL of an unconditional run,
    ``pll_tokens`` (:class:`~mptlml.estimators.results.TokenScores`) for
    :func:`write_pll_tokens`. ``contexts`` (one per text) make every score
    conditional, ``log p(text | context)`` (``context=`` of :func:`mpt_curve`
    and :func:`pll`).
    """
    out: dict[str, dict[str, Any]] = {}
    world = distributed_context().world
    rates = cfg.rate_grid()
    for label, model in models.items():
        run = dict(token_budget=cfg.token_budget, chunk_size=cfg.chunk_size,
                   batch_size=cfg.batch_size, checkpoint_dir=run_dir.path / "checkpoint" / label,
                   progress=cfg.progress)
        target_se = getattr(cfg, "target_se", None)
        curve = partial(mpt_curve, target_se=target_se, max_masks=getattr(cfg, "max_masks", None))
        res = curve(model, texts, rates=rates, num_masks=cfg.num_masks, seed=cfg.seed,
                    nominal_length=cfg.nominal_length, cumulative=cfg.cumulative, ids=ids,
                    whole_word=cfg.whole_word, context=contexts, **run)
        entry: dict[str, Any] = {"curve": res, "placement": {**model.placement(),
                                                             "world_size": world}}
        if cfg.pll and contexts is not None:  # the conditional PLL: per sequence only
            entry["pll"] = pll(model, texts, context=contexts, **run)
        elif cfg.pll:
            tokens = pll(model, texts, per_token=True, whole_word=cfg.whole_word,
                         variant=cfg.pll_variant, **run)
            entry["pll"], entry["pll_tokens"] = tokens.total, tokens
        if contexts is not None:
            entry["contexts"] = contexts
        out[label] = entry
    return out


def write_curves(run_dir: RunDir, scored: Mapping[str, Mapping[str, Any]], *,
                 reference: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 title: str = "MPT curve",
                 baseline: tuple[float, str] | None = None) -> dict[str, Any]:
    """Write curve.csv, per_sequence.csv and the figure; return the summary numbers.

    The CSVs' ``model`` column is the model's name and ``weights`` the entry's
    label (``pretrained``, ``random_init``), so the CSVs of two runs can be
    combined. The summary of each entry holds ``mc_se``, the Monte Carlo
    standard error of the mean LML (over the masks), and with a target
    standard error ``target_se``, ``stop_reason``, the masks per rate and the
    masked inputs scored. ``reference`` curves (e.g. the authors') are drawn
    thin beside ours; ``baseline`` ``(value, label)`` is drawn as a dotted
    horizontal line.
    """
    curve_rows, seq_rows, summary = [], [], {}
    drawn: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    for label, entry in scored.items():
        res: MPTCurve = entry["curve"]
        lengths = res.num_tokens.numpy()  # type: ignore[union-attr]
        name = _model_name(res.model)
        who = {"model": name, "weights": label}
        for r, c, s in zip(res.rates, res.mean.tolist(), res.stderr.tolist(), strict=True):
            curve_rows.append({**who, "rate": float(r), "mean_log_prob": float(c),
                               "stderr": float(s)})
        ids = res.ids or [str(i) for i in range(len(lengths))]
        p = entry.get("pll")
        contexts = entry.get("contexts")
        widths = rate_widths(res.rates)  # the paper's area, per sequence
        scores = res.per_sample.numpy()
        for i, sid in enumerate(ids):
            row = {**who, "id": sid}
            if contexts is not None:
                row["context"] = contexts[i]
            row |= {"num_tokens": int(lengths[i]),
                   "lml_riemann": float(res.lml[i]),  # type: ignore[index]
                   "lml_riemann_se": float(res.lml_stderr[i]),  # type: ignore[index]
                   "area": float(res.nominal_length * (scores[i] * widths).sum())}
            if res.lml_cumulative is not None and res.lml_cumulative_stderr is not None:
                row["lml_cumulative"] = float(res.lml_cumulative[i])
                row["lml_cumulative_se"] = float(res.lml_cumulative_stderr[i])
            if p is not None:
                row["pll"] = float(p[i])
            seq_rows.append(row)
        summary[label] = {
            "model": name, "area": res.area, "area_se": res.area_stderr,
            "nominal_length": res.nominal_length, "num_sequences": int(len(lengths)),
            "mean_num_tokens": float(lengths.mean()),
            "mean_lml_riemann": float(res.lml.mean()),  # type: ignore[union-attr]
            "mean_log_prob_per_token": float(res.mean.mean()),
            "rates": res.rates, "curve": res.mean.numpy(), "curve_se": res.stderr.numpy(),
            "num_masks": res.num_masks, "corruption": res.corruption,
            "mc_se": res.lml_stderr_mean, "num_masked_inputs": res.num_masked_rows,
            "num_model_calls": res.num_model_calls,
            **entry.get("placement", {}),
        }
        if contexts is not None:
            summary[label]["conditional"] = "log p(text | context): masks drawn in the text"
        if res.target_se is not None:
            summary[label] |= {"target_se": res.target_se, "stop_reason": res.stop_reason,
                               "rounds_per_sequence": res.extra.get("rounds")}
        if res.lml_cumulative is not None:
            summary[label]["mean_lml_cumulative"] = float(res.lml_cumulative.mean())
        if p is not None:
            summary[label]["mean_pll"] = float(p.mean())
        drawn[f"{label} (area {res.area:.1f})"] = (res.rates, res.mean.numpy(), res.stderr.numpy())
    run_dir.write_csv("curve.csv", curve_rows)
    cols = sorted({k for r in seq_rows for k in r}, key=lambda k: list(seq_rows[0]).index(k)
                  if k in seq_rows[0] else 99)
    run_dir.write_csv("per_sequence.csv", seq_rows, columns=cols)
    if can_draw():  # else run_job said up front that the figure is left out
        fig, ax = pyplot().subplots(figsize=(7.6, 4.2))
        plot_curves(drawn, reference=reference, title=title, baseline=baseline, ax=ax)
        run_dir.save_figure(fig, "mpt_curve")
    return summary


def write_pll_tokens(run_dir: RunDir, scored: Mapping[str, Mapping[str, Any]],
                     ids: list[str] | None = None) -> None:
    """``pll_tokens.csv``: one row per token (word) of each sequence and model, if scored."""
    rows = [{"model": _model_name(e["curve"].model), "weights": label,
             **{k: v for k, v in r.items() if k != "model"}}
            for label, e in scored.items() if "pll_tokens" in e
            for r in e["pll_tokens"]._rows(  # TokenScores.to_pandas()'s columns
                ids or [str(i) for i in range(len(e["pll_tokens"].tokens))])]
    if rows:
        run_dir.write_csv("pll_tokens.csv", rows, columns=list(rows[0]))


def _model_name(name: str | None) -> str | None:
    """A model's name without the ``" | context"`` of its conditional view."""
    return None if name is None else name.removesuffix(" | context")


def load_model(model: str, cfg: MLMRunConfig, *, random_init: bool = False,
               tokenizer: str | None = None, **kwargs: Any) -> MaskedLM:
    """A masked LM by name (``antiberty``, hub id or directory) on this rank's device.

    Placed and read by ``cfg``: ``device`` (None: the rank's CUDA device when
    CUDA is available, else the CPU, :func:`mptlml._scoring.distributed.resolve_device`),
    ``dtype``, ``autocast``, ``truncate`` and ``corruption``.
    """
    dev = resolve_device(cfg.device)
    place = dict(device=dev, dtype=cfg.dtype, autocast=cfg.autocast, truncate=cfg.truncate,
                 corruption=cfg.corruption, **kwargs)
    if model.lower() == "antiberty":
        if tokenizer is not None:
            raise ValueError("--tokenizer does not apply to antiberty (it has its own).")
        return MaskedLM.antiberty(random_init=random_init, **place)
    return MaskedLM.from_pretrained(model, random_init=random_init, tokenizer=tokenizer, **place)


@dataclass
class CurveConfig(MLMRunConfig):
    """``mptlml curve``: the MPT curve of one masked LM on texts (every flag is a setting)."""

    model: str = setting("", "hub name, local directory (save_pretrained) or 'antiberty'",
                         required=True)
    data: str = setting("", "a .txt/.csv/.tsv/.parquet/.jsonl/.fasta file, glue:TASK, or "
                        "'antibodies'", required=True)
    column: str | None = setting(None, "column/field with the text; A,B joins a sentence pair; "
                                 "0-based positions for a header-less CSV/TSV")
    split: str | None = setting(None, "GLUE split (default validation; ax: test); not for files")
    random_init: bool = setting(False, "score a randomly initialised model of the same config")
    tokenizer: str | None = setting(None, "tokenizer name or directory, for a model directory "
                                    "saved without one")
    allow_unknown: bool = setting(False, "accept more than 5% unknown tokens (an error by "
                                  "default)")
    target_se: float | None = setting(None, "draw masks in rounds until this Monte Carlo "
                                      "standard error of the mean LML, in nats; num_masks "
                                      "is then the first round's per rate",
                                      min=MIN_TARGET_SE)
    max_masks: int | None = setting(None, "with --target-se: the most masked inputs per "
                                    "sequence (the rounds stop there; stop_reason then "
                                    "says 'budget')", min=1)
    id_column: str | None = setting(None, "column/field of the sequence ids in a table (default "
                                    "'id', else 'idx', when present; else the row numbers)")
    context_column: str | None = setting(None, "column/field of each text's context in a table "
                                         "(default 'context' when present): the curve is then "
                                         "log p(text | context), the context always visible; "
                                         "context and text are joined as written (end the "
                                         "context with a space where a word ends)")

    def validate(self) -> None:
        """A model and data are given; the shared checks; no two settings that conflict."""
        super().validate()
        for key in ("model", "data"):
            if not getattr(self, key):
                raise ValueError(f"{key} is empty; give --{key}.")
        if self.max_masks is not None and self.target_se is None:
            raise ValueError("--max-masks bounds the masks that --target-se plans; give "
                             "--target-se too, or set the masks yourself with --num-masks.")
        if self.target_se is not None and self.cumulative:
            raise ValueError("--cumulative does not combine with --target-se (the cumulative "
                             "sum is a separate estimate at --num-masks per size); drop one.")
        if self.context_column is not None and (self.whole_word
                                                or self.pll_variant != "original"):
            raise ValueError(f"--context-column {self.context_column} scores the text's tokens "
                             "given its context; it does not combine with --whole-word or "
                             "--pll-variant word_l2r.")


@dataclass
class CurveInputs:
    """What :func:`load_curve` checked before the run directory exists: the model and the texts."""

    model: MaskedLM
    texts: Any  # mptlml.data.text.Texts


def load_curve(cfg: CurveConfig) -> CurveInputs:
    """Load and check the model and every sequence (empty, too long, no words) up front."""
    from ..data.text import bundled_antibodies, load_texts

    if cfg.data == "antibodies":
        for key in ("id_column", "context_column"):
            if getattr(cfg, key) is not None:
                raise ValueError(f"--{key.replace('_', '-')} applies to a table, not to the "
                                 "bundled antibodies.")
        texts = bundled_antibodies(cfg.num_sequences)
    else:  # the texts first: a bad file is refused before the model is loaded
        texts = load_texts(cfg.data, column=cfg.column, split=cfg.split,
                           limit=cfg.num_sequences, id_column=cfg.id_column,
                           context_column=cfg.context_column)
    if texts.contexts is not None and (cfg.whole_word or cfg.pll_variant != "original"):
        raise ValueError(f"{cfg.data} has a context column {texts.context_column!r}: the curve "
                         "is then scored given it, which does not combine with --whole-word or "
                         "--pll-variant word_l2r (drop those, or pass another --context-column).")
    lm = load_model(cfg.model, cfg, random_init=cfg.random_init, tokenizer=cfg.tokenizer,
                    allow_unknown=cfg.allow_unknown)
    # raises on empty / too long sequences (with their contexts) before any file is made
    with_context(lm, texts.contexts).encode(texts.texts)
    if texts.contexts is not None:
        _log.info(f"scoring log p(text | context): the contexts are {cfg.data}'s column "
                  f"{texts.context_column!r}, always visible and never scored")
    if cfg.whole_word or cfg.pll_variant != "original":
        lm.encode_words(texts.texts)  # and on a tokenizer without words
    return CurveInputs(lm, texts)


def run_curve(cfg: CurveConfig, run_dir: RunDir, inputs: CurveInputs) -> dict[str, Any]:
    """Score the model; write curve.csv, per_sequence.csv, pll_tokens.csv and the figure."""
    lm, texts = inputs.model, inputs.texts
    label = "random_init" if cfg.random_init else "pretrained"
    scored = score_models({label: lm}, texts.texts, cfg, run_dir=run_dir, ids=texts.ids,
                          contexts=texts.contexts)
    if not distributed_context().main:
        return {}
    given = "" if texts.contexts is None else f" given {texts.context_column}"
    summ = write_curves(run_dir, scored, title=f"MPT curve: {lm.name}{given}")
    write_pll_tokens(run_dir, scored, texts.ids)
    out: dict[str, Any] = {"data": texts.source, "models": summ}
    if texts.contexts is not None:
        out["context_column"] = texts.context_column
    return out


def curve_summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows ``mptlml curve`` prints to stdout (even under ``-q``).

    Area, SE, L, mean LML and its Monte Carlo SE (``mc_se``, over the masks);
    with a context column, ``given``; with a target SE, the target and
    ``stop_reason``.
    """
    rows = []
    for s in results["models"].values():
        row = {"model": s.get("model")}
        if results.get("context_column") is not None:
            row["given"] = results["context_column"]
        row |= {"sequences": s["num_sequences"], "area": s["area"], "area_se": s["area_se"],
                "L": s["nominal_length"], "mean_lml_riemann": s["mean_lml_riemann"],
                "mc_se": s.get("mc_se")}
        row.update({k: s[k] for k in ("mean_lml_cumulative", "mean_pll", "target_se", "stop_reason")
                    if k in s})
        rows.append(row)
    return rows


JOB = Job(config=CurveConfig, load=load_curve, run=run_curve, summary=curve_summary,
          resumable=True, needs=("transformers",), figures=True,
          help="MPT curve of any Hugging Face masked LM on texts",
          description="MPT curve (mean log-prob of masked tokens vs masking rate), its area and "
                      "per-sequence LML estimates. Runs under torchrun / accelerate launch for "
                      "data-parallel scoring.")
