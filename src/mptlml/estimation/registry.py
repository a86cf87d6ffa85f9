"""The estimator registry: one entry per estimator, with the options it accepts.

:func:`mptlml.estimate_lml` looks the estimator up by name and refuses an
option the estimator does not use (never ignores it), so adding an estimator
is one function and one :func:`register` call, not another branch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EstimatorSpec", "check_options", "lookup", "register"]


@dataclass(frozen=True)
class EstimatorSpec:
    """An estimator of log p(x): its name, function, accepted options and a summary.

    Attributes
    ----------
    name : str
    fn : callable
        Computes the estimate; its signature is the registry's (see the module
        that owns the registry).
    options : frozenset of str
        Optional arguments the estimator uses beyond the common ones.
    summary : str
        One line: the formula and whether it is unbiased.
    """

    name: str
    fn: Callable[..., Any]
    options: frozenset[str]
    summary: str


def register(registry: dict[str, EstimatorSpec], name: str, summary: str,
             options: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: add ``fn`` to ``registry`` under ``name``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        registry[name] = EstimatorSpec(name, fn, frozenset(options), summary)
        return fn

    return deco


def lookup(registry: Mapping[str, EstimatorSpec], name: str, kind: str) -> EstimatorSpec:
    """The spec of ``name``, or a ValueError listing the estimators of this ``kind`` of data."""
    if name not in registry:
        raise ValueError(f"unknown estimator {name!r} for {kind}; choose one of "
                         f"{', '.join(registry)}.")
    return registry[name]


def check_options(spec: EstimatorSpec, given: Mapping[str, Any], kind: str,
                  hints: Mapping[str, str] | None = None) -> None:
    """Refuse the options in ``given`` that ``spec`` does not use.

    ``hints`` maps an option to the message to give instead of the generic one.
    """
    bad = sorted(set(given) - spec.options)
    if not bad:
        return
    hints = hints or {}
    for name in bad:
        if name in hints:
            raise ValueError(hints[name].format(estimator=spec.name))
    uses = ", ".join(sorted(spec.options)) or "none"
    raise TypeError(f"argument(s) {bad} do not apply to estimator {spec.name!r} on {kind} "
                    f"(its options: {uses}); drop them.")
