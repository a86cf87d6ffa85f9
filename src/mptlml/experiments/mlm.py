"""Masked-LM runs: MPT curves of one or more models on texts, written to a run directory.

Shared by ``mptlml curve`` and the ``antibody``/``bert`` reproductions. Files:

- ``curve.csv``: model, rate, mean log-prob of the masked tokens, standard error;
- ``per_sequence.csv``: model, id, D_i, LML estimate D_i * mean_k S_ik (and
  the exact cumulative sum when computed), PLL when computed;
- ``pll_tokens.csv`` (with the PLL): model, id, position, token, log_prob per
  token (per word with whole-word masking; a ``word`` column for word-level runs);
- ``mpt_curve.png/.pdf``: the curves with +-1 standard error bands;
- ``checkpoint/``: finished chunks, so an interrupted run resumes (``--resume``).

Under ``torchrun``/``accelerate launch`` every process scores its share of
the sequences on its own device and only rank 0 writes the result files.
``results.json`` records each model's device, dtype and autocast and the
world size.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..estimation import MPTCurve, mlm_curve, pll
from ..estimation.distributed import barrier, distributed_context, resolve_device
from ..estimation.rates import check_rates, rate_grid, rate_widths
from ..estimators import mpt_curve
from ..models.masked_lm import MaskedLM
from .common import RunDir, pyplot
from .config import ExperimentConfig, setting

__all__ = ["MLMDeviceSettings", "RateGridSettings", "load_model", "parse_rates",
           "plot_paired_curves", "prepare_run_dir", "project_root", "run_curve", "score_models",
           "write_curves", "write_pll_tokens"]

_log = logging.getLogger(__name__)


@dataclass
class MLMDeviceSettings(ExperimentConfig):
    """Where and how a masked LM runs: the settings every MLM experiment shares.

    Recorded in results.json (with the world size) so that a number says what ran it.
    """

    batch_size: int | None = setting(None, "sequences per forward pass, beside token_budget "
                                     "(default: as many as the budget allows)", min=1)
    device: str | None = setting(None, "torch device (default: the rank's CUDA device when "
                                 "available, else cpu)")
    dtype: str | None = setting(None, "model dtype (default: the checkpoint's)",
                                choices=("float32", "float16", "bfloat16", "float64"))
    autocast: bool | None = setting(None, "autocast the forward pass to bfloat16/float16 "
                                    "(default: off)")


@dataclass
class RateGridSettings(ExperimentConfig):
    """The masking-rate grid of an MPT curve: ``rate_start, rate_start + rate_step, ..., 0.99``."""

    rate_start: float = setting(0.01, "first masking rate of the curve (up to 0.99)", gt=0, lt=1)
    rate_step: float = setting(0.01, "step of the curve's masking-rate grid", gt=0, lt=1)

    def rates(self) -> np.ndarray:
        """The grid (:func:`mptlml.estimation.rates.rate_grid`)."""
        return rate_grid(self.rate_start, self.rate_step)


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


def prepare_run_dir(out: str | os.PathLike, name: str, *, overwrite: bool,
                    resume: bool) -> RunDir:
    """The run directory on every rank: rank 0 stages it (and locks it), the others join.

    The staging directory starts empty unless ``resume`` (then from the
    finished checkpoint chunks), so ``overwrite`` never meets a stale checkpoint.
    """
    ctx = distributed_context()
    if ctx.main:
        rd = RunDir(out, name, overwrite=overwrite, resume=resume)
    barrier(ctx)
    if not ctx.main:
        rd = RunDir(out, name, worker=True)
    return rd


def score_models(models: Mapping[str, MaskedLM], texts: Sequence[str], *, rates: Any,
                 num_masks: int, seed: int, run_dir: RunDir, nominal_length: float | None,
                 exact: bool = False, with_pll: bool = False, token_budget: int = 8192,
                 chunk_size: int = 8, batch_size: int | None = None, progress: bool = True,
                 ids: list[str] | None = None, whole_word: bool = False,
                 pll_variant: str = "original",
                 target_se: float | None = None) -> dict[str, dict[str, Any]]:
    """Curve (and optionally PLL) of each model; checkpoints under ``run_dir/checkpoint``.

    ``target_se``: masks per rate allocated for that Monte Carlo standard error
    of the mean LML (:func:`mptlml.mpt_curve`; ``num_masks`` is then the pilot).

    Each entry also holds ``settings``: the model's device, dtype, autocast
    and the world size, which :func:`write_curves` records; with the PLL,
    ``pll_tokens`` (:class:`~mptlml.estimation.words.TokenScores`) for
    :func:`write_pll_tokens`. ``whole_word`` masks words (curve and PLL);
    ``pll_variant`` is the PLL's ``variant``.
    """
    out: dict[str, dict[str, Any]] = {}
    world = distributed_context().world
    for label, model in models.items():
        run = dict(token_budget=token_budget, chunk_size=chunk_size, batch_size=batch_size,
                   checkpoint_dir=run_dir.path / "checkpoint" / label, progress=progress)
        if target_se is not None:  # issue 24: a target standard error
            res = mpt_curve(model, texts, rates=rates, num_masks=num_masks, seed=seed,
                            nominal_length=nominal_length, exact=exact, ids=ids,
                            whole_word=whole_word, target_se=target_se, **run)
        else:
            res = mlm_curve(model, texts, rates=rates, num_masks=num_masks, seed=seed,
                            nominal_length=nominal_length, exact=exact, ids=ids,
                            whole_word=whole_word, **run)
        entry: dict[str, Any] = {"curve": res, "settings": {**model.settings(),
                                                            "world_size": world}}
        if with_pll:
            tokens = pll(model, texts, per_token=True, whole_word=whole_word,
                         variant=pll_variant, **run)
            entry["pll"], entry["pll_tokens"] = tokens.total, tokens
        out[label] = entry
    return out


def write_curves(run_dir: RunDir, scored: Mapping[str, Mapping[str, Any]], *,
                 reference: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 title: str = "MPT curve",
                 baseline: tuple[float, str] | None = None) -> dict[str, Any]:
    """Write curve.csv, per_sequence.csv and the figure; return the summary numbers.

    ``reference`` curves (e.g. the authors') are drawn thin beside ours;
    ``baseline`` ``(value, label)`` is drawn as a dotted horizontal line.
    """
    curve_rows, seq_rows, summary = [], [], {}
    drawn: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray | None]] = {}
    for label, entry in scored.items():
        res: MPTCurve = entry["curve"]
        lengths = res.num_tokens.numpy()  # type: ignore[union-attr]
        for r, c, s in zip(res.rates, res.mean.tolist(), res.stderr.tolist(), strict=True):
            curve_rows.append({"model": label, "rate": float(r), "mean_log_prob": float(c),
                               "stderr": float(s)})
        ids = res.ids or [str(i) for i in range(len(lengths))]
        p = entry.get("pll")
        widths = rate_widths(res.rates)  # the paper's area, per sequence
        scores = res.per_sample.numpy()
        for i, sid in enumerate(ids):
            row = {"model": label, "id": sid, "num_tokens": int(lengths[i]),
                   "lml_riemann": float(res.lml[i]),  # type: ignore[index]
                   "lml_riemann_se": float(res.lml_stderr[i]),  # type: ignore[index]
                   "area": float(res.nominal_length * (scores[i] * widths).sum())}
            if res.lml_exact is not None and res.lml_exact_stderr is not None:
                row["lml_exact"] = float(res.lml_exact[i])
                row["lml_exact_se"] = float(res.lml_exact_stderr[i])
            if p is not None:
                row["pll"] = float(p[i])
            seq_rows.append(row)
        summary[label] = {
            "model": res.model, "area": res.area, "area_se": res.area_stderr,
            "nominal_length": res.nominal_length, "num_sequences": int(len(lengths)),
            "mean_num_tokens": float(lengths.mean()),
            "mean_lml_riemann": float(res.lml.mean()),  # type: ignore[union-attr]
            "mean_log_prob_per_token": float(res.mean.mean()),
            "rates": res.rates, "curve": res.mean.numpy(), "curve_se": res.stderr.numpy(),
            "num_masks": res.num_masks, "corruption": res.corruption,
            **entry.get("settings", {}),
        }
        if res.lml_exact is not None:
            summary[label]["mean_lml_exact"] = float(res.lml_exact.mean())
        if p is not None:
            summary[label]["mean_pll"] = float(p.mean())
        drawn[f"{label} (area {res.area:.1f})"] = (res.rates, res.mean.numpy(), res.stderr.numpy())
    fig = plot_paired_curves(drawn, reference=reference, title=title, baseline=baseline)
    run_dir.write_csv("curve.csv", curve_rows)
    cols = sorted({k for r in seq_rows for k in r}, key=lambda k: list(seq_rows[0]).index(k)
                  if k in seq_rows[0] else 99)
    run_dir.write_csv("per_sequence.csv", seq_rows, columns=cols)
    run_dir.save_figure(fig, "mpt_curve")
    return summary


def write_pll_tokens(run_dir: RunDir, scored: Mapping[str, Mapping[str, Any]],
                     ids: list[str] | None = None) -> None:
    """``pll_tokens.csv``: one row per token (word) of each sequence and model, if scored."""
    rows = [r for label, e in scored.items() if "pll_tokens" in e
            for r in e["pll_tokens"].rows(label, ids)]
    if rows:
        run_dir.write_csv("pll_tokens.csv", rows, columns=list(rows[0]))


def _pair_key(label: str) -> tuple[str, bool]:
    """``(group, random)`` of a curve label: one colour per group, dashed for random init.

    ``"cola-pretrained (area ...)"``, ``"cola random-init"`` and
    ``"random_init"`` give ``("cola", False)``, ``("cola", True)`` and ``("", True)``.
    """
    low = label.split(" (")[0].strip().lower()
    rnd = "random" in low
    group = re.sub(r"[-_ ]*(pre-?trained|random[-_ ]?init(ialis|ializ)?(ation|ed)?)$", "", low)
    return group.strip(" -_"), rnd


def plot_paired_curves(curves: Mapping[str, tuple[np.ndarray, np.ndarray, Any]], *,
                       reference: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                       title: str = "MPT curve",
                       baseline: tuple[float, str] | None = None) -> Any:
    """MPT curves with each group's pre-trained and random-init curves paired.

    One colour per group (e.g. a GLUE task); pre-trained solid, random init
    dashed; ``curves`` values are ``(rates, mean, stderr or None)`` (stderr as a
    band), ``reference`` curves are drawn thin in their group's colour. The
    legend sits beside the axes, so it never covers a curve. Returns the figure.
    """
    from matplotlib.lines import Line2D

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 4.2))
    groups: dict[str, str] = {}

    def colour(label: str) -> tuple[str, str]:
        g, rnd = _pair_key(label)
        groups.setdefault(g, f"C{len(groups) % 10}")
        return groups[g], "--" if rnd else "-"

    for label, (r, c, se) in curves.items():
        col, ls = colour(label)
        ax.plot(r, c, ls, color=col, lw=1.6)
        if se is not None:
            band = np.nan_to_num(np.asarray(se, dtype=float))
            ax.fill_between(r, np.asarray(c) - band, np.asarray(c) + band, alpha=0.2, color=col)
    for label, (r, c) in (reference or {}).items():
        col, ls = colour(label)
        ax.plot(r, c, ls, color=col, lw=0.9, alpha=0.55 if curves else 1.0)
    if baseline is not None:
        ax.axhline(baseline[0], color="grey", ls=":", lw=1)
    handles = [Line2D([], [], color=col, lw=2, label=g.upper() if len(g) <= 5 else g)
               for g, col in groups.items() if g]
    handles += [Line2D([], [], color="k", ls="-", lw=1.6, label="pre-trained"),
                Line2D([], [], color="k", ls="--", lw=1.6, label="random init")]
    if curves and reference:
        handles.append(Line2D([], [], color="k", lw=0.9, alpha=0.55, label="authors' curves"))
    if baseline is not None:
        handles.append(Line2D([], [], color="grey", ls=":", lw=1, label=baseline[1]))
    areas = [label for label in curves if "(area" in label]
    if areas:
        handles += [Line2D([], [], lw=0, label=label) for label in areas]
    ax.set_xlabel("masking rate")
    ax.set_ylabel("mean log-prob of masked tokens (nats)")
    ax.set_title(title)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    fig.tight_layout()
    return fig


def project_root() -> Path:
    """The project root (``src/mptlml/experiments`` three levels up)."""
    return Path(__file__).resolve().parents[3]


def load_model(model: str, *, random_init: bool = False, tokenizer: str | None = None,
               device: str | None = None, dtype: str | None = None,
               autocast: bool | None = None, **kwargs: Any) -> MaskedLM:
    """A masked LM by name (``antiberty``, hub id or directory) on this rank's device.

    ``device`` None: the rank's CUDA device when CUDA is available, else the
    CPU (:func:`mptlml.estimation.distributed.resolve_device`).
    """
    dev = resolve_device(device)
    if model.lower() == "antiberty":
        if tokenizer is not None:
            raise ValueError("--tokenizer does not apply to antiberty (it has its own).")
        return MaskedLM.antiberty(random_init=random_init, device=dev, dtype=dtype,
                                  autocast=autocast, **kwargs)
    return MaskedLM.from_pretrained(model, random_init=random_init, tokenizer=tokenizer,
                                    device=dev, dtype=dtype, autocast=autocast, **kwargs)


def run_curve(model: str, data: str, out: str | os.PathLike, *, random_init: bool = False,
              column: str | None = None, split: str | None = None, limit: int | None = None,
              rates: str | None = None, num_masks: int = 1, seed: int = 0,
              nominal_length: float | None = None, exact: bool = False, with_pll: bool = False,
              truncate: bool = False, corruption: str = "mask", token_budget: int = 8192,
              chunk_size: int = 8, batch_size: int | None = None, device: str | None = None,
              dtype: str | None = None, autocast: bool | None = None,
              tokenizer: str | None = None, allow_unknown: bool = False,
              overwrite: bool = False, resume: bool = False, progress: bool = True,
              whole_word: bool = False, pll_variant: str = "original",
              target_se: float | None = None) -> dict[str, Any]:
    """``mptlml curve``: MPT curve of one masked LM on texts, into a run directory.

    ``model`` is a hub name, a local directory, or ``antiberty``; ``data`` a
    local file, ``glue:TASK`` or ``antibodies`` (the bundled FASTA). All input
    is validated (model, data, every sequence's length, the rates) before the
    run directory is created, so a bad input leaves no result file.
    ``device``/``dtype``/``autocast`` place the model (see :func:`load_model`)
    and are recorded with the world size in ``results.json``. ``whole_word``
    masks words (curve and PLL); ``pll_variant`` ``"word_l2r"`` is PLL-word-l2r.
    """
    import json

    from ..data.text import bundled_antibodies, load_texts

    r = check_rates(parse_rates(rates))
    if pll_variant != "original" and not with_pll:
        raise ValueError(f"--pll-variant {pll_variant} applies to the PLL; add --pll.")
    lm = load_model(model, random_init=random_init, tokenizer=tokenizer, device=device,
                    dtype=dtype, autocast=autocast, truncate=truncate, corruption=corruption,
                    allow_unknown=allow_unknown)
    texts = (bundled_antibodies(limit) if data == "antibodies"
             else load_texts(data, column=column, split=split, limit=limit))
    lm.encode(texts.texts)  # raises on empty / too long sequences before any file is made
    if whole_word or pll_variant != "original":
        lm.encode_words(texts.texts)  # and on a tokenizer without words
    with prepare_run_dir(out, "curve", overwrite=overwrite, resume=resume) as run_dir:
        label = "random_init" if random_init else "pretrained"
        scored = score_models({label: lm}, texts.texts, rates=r, num_masks=num_masks, seed=seed,
                              run_dir=run_dir, nominal_length=nominal_length, exact=exact,
                              with_pll=with_pll, token_budget=token_budget,
                              chunk_size=chunk_size, batch_size=batch_size, progress=progress,
                              ids=texts.ids, whole_word=whole_word, pll_variant=pll_variant,
                              target_se=target_se)
        if not distributed_context().main:
            return {}
        summ = write_curves(run_dir, scored, title=f"MPT curve: {lm.name}")
        write_pll_tokens(run_dir, scored, texts.ids)
        config = {"model": model, "data": texts.source, "random_init": random_init,
                  "rates": r, "num_masks": num_masks, "nominal_length": nominal_length,
                  "exact": exact, "pll": with_pll, "truncate": truncate,
                  "corruption": corruption, "token_budget": token_budget,
                  "chunk_size": chunk_size, "batch_size": batch_size, "tokenizer": tokenizer,
                  "allow_unknown": allow_unknown, "whole_word": whole_word,
                  "pll_variant": pll_variant, "target_se": target_se,
                  **scored[label]["settings"]}
        path = run_dir.write_results(config, {"models": summ}, seed=seed)
    s = summ[label]
    _log.info(f"{lm.name}: {s['num_sequences']} sequences, area {s['area']:.2f} "
              f"(+- {s['area_se']:.2f}, L={s['nominal_length']:.1f}), mean LML estimate "
              f"{s['mean_lml_riemann']:.2f}; results in {path.parent}/")
    return json.loads(path.read_text())
