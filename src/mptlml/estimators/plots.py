"""Figures of the results: MPT curves (:func:`plot_curves`) and compared candidates
(:func:`plot_comparison`).

:meth:`MPTCurve.plot <mptlml.estimators.results.MPTCurve.plot>` and
:meth:`Comparison.plot <mptlml.estimators.results.Comparison.plot>` draw through
these, and so do the figures of ``mptlml curve``, ``mptlml demo`` and the
reproduced masked-LM parts: one plotter per kind of figure. Each draws on the
``ax`` given (else on a new figure of ``matplotlib.pyplot``, whatever its
backend) and returns the Axes. Needs matplotlib (the ``report`` extra).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._optional import require

__all__ = ["plot_comparison", "plot_curves"]

_GID = "mptlml-curve-group:"  # a drawn curve's group, read back by a later call on its Axes


def _axes(ax: Any, purpose: str, figsize: tuple[float, float]) -> Any:
    """``ax``, or the Axes of a new figure (matplotlib required, named in the error)."""
    require("matplotlib", purpose)
    if ax is not None:
        from matplotlib.axes import Axes

        if not isinstance(ax, Axes):
            hint = (" (a Figure: pass fig.add_subplot() or one of fig.axes)"
                    if type(ax).__name__ in ("Figure", "SubFigure") else
                    " (an array of Axes from plt.subplots(n): pass one of them)"
                    if hasattr(ax, "flat") else "")
            raise TypeError(f"{purpose}: ax must be a matplotlib Axes (e.g. "
                            f"plt.subplots()[1]) or None (a new figure), got "
                            f"{type(ax).__name__}{hint}.")
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)[1]


def _pair_key(label: str) -> tuple[str, bool]:
    """``(group, random)`` of a curve label: one colour per group, dashed for random init.

    ``"cola-pretrained (area ...)"``, ``"cola random-init"``, ``"AntiBERTy (random
    init) (area ...)"`` and ``"random_init"`` give ``("cola", False)``, ``("cola", True)``,
    ``("AntiBERTy", True)`` and ``("", True)``.
    """
    text = re.sub(r"\s*\(area [^)]*\)", "", label).strip()
    rnd = "random" in text.lower()
    pattern = r"[-_ (]*(pre-?trained|random[-_ ]?init(ialis|ializ)?(ation|ed)?)\)?$"
    return re.sub(pattern, "", text, flags=re.IGNORECASE).strip(" -_"), rnd


def _display_label(label: str) -> str:
    """A curve label as a legend shows it: ``"random_init"`` -> ``"random init"``."""
    out = re.sub(r"random[-_ ]init", "random init", label)
    out = re.sub(r"\bpretrained", "pre-trained", out)
    return re.sub(r"-(pre-trained|random init)", r" \1", out)


def plot_curves(curves: Mapping[str, tuple[Any, Any, Any]], *,
                reference: Mapping[str, tuple[Any, Any]] | None = None,
                title: str = "MPT curve", baseline: tuple[float, str] | None = None,
                ax: Any = None) -> Any:
    """MPT curves, each group's pre-trained and random-init curves paired; returns the Axes.

    Parameters
    ----------
    curves : mapping
        ``label -> (rates, mean, stderr or None)``; ``stderr`` is drawn as a
        band of ±1 standard error. One colour per group (the label without
        ``pre-trained``/``random init``, e.g. a GLUE task); pre-trained solid,
        random init dashed. A label with ``"(area ...)"`` is shown in the legend.
    reference : mapping, optional
        ``label -> (rates, mean)``, drawn thin in their group's colour (e.g. the
        authors' published curves).
    title : str
        The Axes' title.
    baseline : tuple ``(value, label)``, optional
        A dotted horizontal line.
    ax : matplotlib Axes, optional
        Where to draw (default: a new figure).

    Notes
    -----
    The legend sits beside the Axes, outside them, so it never covers a curve;
    save with ``bbox_inches="tight"`` to keep it.
    """
    require("matplotlib", "plotting an MPT curve")
    from matplotlib.lines import Line2D

    ax = _axes(ax, "plotting an MPT curve", (7.6, 4.2))
    # drawing onto Axes that hold curves already (curve.plot(ax=ax) twice): a new group
    # takes a new colour, a curve of an earlier group (its random init) that group's colour,
    # and the legend keeps the earlier entries
    groups: dict[str, str] = {line.get_gid()[len(_GID):]: str(line.get_color())
                              for line in ax.lines if str(line.get_gid()).startswith(_GID)}
    offset = len({str(line.get_color()) for line in ax.lines}) - len(groups)
    earlier = list(ax.get_legend().legend_handles) if ax.get_legend() is not None else []
    drawn: dict[str, int] = {}

    def colour(label: str) -> tuple[str, str]:
        g, rnd = _pair_key(label)
        groups.setdefault(g.lower(), f"C{(offset + len(groups)) % 10}")
        return groups[g.lower()], "--" if rnd else "-"

    for label, (r, c, se) in curves.items():
        col, ls = colour(label)
        g = _pair_key(label)[0]
        drawn[g] = drawn.get(g, 0) + 1
        r, c = np.asarray(r, dtype=float), np.asarray(c, dtype=float)
        ax.plot(r, c, ls, color=col, lw=1.6, gid=_GID + g.lower())
        if se is not None:
            band = np.nan_to_num(np.asarray(se, dtype=float))
            ax.fill_between(r, c - band, c + band, alpha=0.2, color=col)
    for label, (r, c) in (reference or {}).items():
        col, ls = colour(label)
        g = _pair_key(label)[0]
        drawn[g] = drawn.get(g, 0) + 1
        ax.plot(r, c, ls, color=col, lw=0.9, alpha=0.55 if curves else 1.0,
                gid=_GID + g.lower())
    if baseline is not None:
        ax.axhline(baseline[0], color="grey", ls=":", lw=1)
    # a group's colour in the legend when it pairs curves (a single curve's entry says it)
    handles = [Line2D([], [], color=groups[g.lower()], lw=2,
                      label=g.upper() if len(g) <= 5 else g)
               for g, count in drawn.items() if g and count > 1]
    areas = [label for label in curves if "(area" in label]
    dashed = any(_pair_key(label)[1] for label in [*curves, *(reference or {})])
    # solid/dashed explained where random init is drawn and the area entries do not say it
    if dashed and (len(drawn) > 1 or not areas or reference):
        handles += [Line2D([], [], color="k", ls="-", lw=1.6, label="pre-trained"),
                    Line2D([], [], color="k", ls="--", lw=1.6, label="random init")]
    if curves and reference:
        handles.append(Line2D([], [], color="k", lw=0.9, alpha=0.55, label="authors' curves"))
    # each curve's area beside the line it labels (colour and style of that curve)
    handles += [Line2D([], [], color=colour(label)[0], ls=colour(label)[1], lw=1.6,
                       label=_display_label(label)) for label in areas]
    if any(se is not None for _, _, se in curves.values()):
        handles.append(Line2D([], [], color="grey", lw=6, alpha=0.3, label="±1 SE"))
    if baseline is not None:
        handles.append(Line2D([], [], color="grey", ls=":", lw=1, label=baseline[1]))
    labels = {h.get_label() for h in earlier}
    handles = earlier + [h for h in handles if h.get_label() not in labels]
    handles.sort(key=lambda h: h.get_label() == "±1 SE")  # last, below the curves
    ax.set_xlabel("masking rate")
    ax.set_ylabel("mean log-prob of a masked token (nats)")
    ax.set_title(title)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
    ax.figure.tight_layout()
    return ax


def _short(text: Any, width: int = 24) -> str:
    s = text if isinstance(text, str) else " ".join(str(t) for t in text)
    s = repr(s) if isinstance(text, str) else f"[{s}]"
    return s if len(s) <= width else s[:width - 1] + "…"


def plot_comparison(res: Any, question: int | None = None, *, ax: Any = None) -> Any:
    """The candidates of one question of a :class:`~mptlml.estimators.results.Comparison`.

    Each candidate's estimate of log p(candidate | context) with a bar of ±2
    standard errors (none for an exact candidate), the leader marked, and beside
    every other candidate its difference to the leader with the paired standard
    error (the one the decision uses). Returns the Axes.

    Parameters
    ----------
    res : Comparison
        What :func:`mptlml.compare` returned.
    question : int, optional
        Which question (default: the only one; required when there are several).
    ax : matplotlib Axes, optional
        Where to draw (default: a new figure).
    """
    n = len(res.candidates)
    if question is None:
        if n != 1:
            raise ValueError(f"this comparison has {n} questions; pass question= (0..{n - 1}) "
                             "to plot one.")
        question = 0
    if isinstance(question, bool) or not isinstance(question, int | np.integer) \
            or not 0 <= question < n:
        raise ValueError(f"question must be an int in 0..{n - 1}, got {question!r}.")
    q = int(question)
    scores, se = np.asarray(res.scores[q], float), np.asarray(res.stderr[q], float)
    paired, lead = np.asarray(res.paired_stderr[q], float), res.choice[q]
    k = len(scores)
    ax = _axes(ax, "Comparison.plot()", (7.0, 0.9 + 0.45 * k))
    y = np.arange(k)[::-1]  # the first candidate on top
    colours = ["C1" if i == lead else "C0" for i in range(k)]
    for i in range(k):
        ax.errorbar(scores[i], y[i], xerr=2 * np.nan_to_num(se[i]), fmt="o", ms=5,
                    color=colours[i], capsize=3, lw=1.2)
    span = float(np.ptp(scores + 2 * np.nan_to_num(se))) or 1.0
    for i in range(k):
        if i == lead:
            text = "chosen" + (" (decided)" if res.decided[q] else " (undecided)")
        else:
            text = f"Δ {scores[i] - scores[lead]:+.2f} ± {paired[i]:.2f}"
        ax.annotate(text, (scores[i] + 2 * np.nan_to_num(se[i]), y[i]),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=7,
                    color=colours[i])
    ax.set_xlim(ax.get_xlim()[0], ax.get_xlim()[1] + 0.35 * span)  # room for the notes
    ax.set_yticks(y, [_short(c) for c in res.candidates[q]])
    ax.set_ylim(-0.7, k - 0.3)
    ax.set_xlabel("log p(candidate | context), nats (bars: ±2 SE; Δ: to the chosen, "
                  "± paired SE)")
    ctx = res.contexts[q]
    ax.set_title(f"question {q}: {_short(ctx, 40) if ctx is not None else 'no context'}"
                 f"  ({res.stop_reason[q]})", fontsize=9)
    ax.figure.tight_layout()
    return ax
