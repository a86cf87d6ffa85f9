"""Input validation shared by the public entry points.

Validation happens once, where the user hands data to the package. Every
message says what was wrong and what to pass instead.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "ALLOCATIONS",
    "FALSE_WORDS",
    "MIN_TARGET_SE",
    "MONTE_CARLO_OPTIONS",
    "check_checkpoint_dir",
    "TRUE_WORDS",
    "Interval",
    "InvalidOptionError",
    "SEED_INT",
    "Options",
    "as_tensor",
    "check_options",
    "check_context",
    "check_data",
    "check_device",
    "check_mask",
    "check_positive_int",
    "check_rate",
    "check_size",
    "env_flag",
    "make_generator",
    "parse_flag",
]

#: the words of a yes/no setting (any case, surrounding spaces ignored)
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_flag(value: str, name: str) -> bool:
    """``value`` as a yes/no setting: True for 1/true/yes/on, False for 0/false/no/off.

    Any case and surrounding spaces are accepted; anything else is refused
    with a ValueError naming ``name`` (never read as one or the other).
    """
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{name} must be yes or no ({'/'.join(TRUE_WORDS)} or "
                     f"{'/'.join(FALSE_WORDS)}, any case), got {value!r}.")


def env_flag(name: str, default: bool) -> bool:
    """The yes/no environment variable ``name`` (:func:`parse_flag`); ``default`` if unset/empty."""
    raw = os.environ.get(name, "")
    return default if not raw.strip() else parse_flag(raw, f"the environment variable {name}")


def as_tensor(value: Any, name: str, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> torch.Tensor:
    """Convert arrays, lists and tensors to a floating tensor.

    Float32/float64 inputs keep their dtype unless ``dtype`` is given; integer,
    boolean and Python inputs become float64.
    """
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, np.ndarray | list | tuple | numbers.Number):
        arr = np.asarray(value)
        if arr.dtype == object:
            raise TypeError(f"{name} must be numeric; got an object array. Pass a float array.")
        t = torch.from_numpy(np.array(arr, copy=True))
    else:
        raise TypeError(
            f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}."
        )
    if dtype is None:
        dtype = t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float64
    return t.to(dtype=dtype, device=device)


def check_data(x: Any, num_tokens: int | None = None, *, dtype: torch.dtype | None = None,
               device: torch.device | str | None = None, name: str = "x") -> torch.Tensor:
    """Validate a data matrix of shape ``(N, D)`` and return it as a tensor.

    Raises
    ------
    ValueError
        If ``x`` is not 2-D, is empty, holds NaN/inf, or its D does not match
        ``num_tokens``.
    """
    t = as_tensor(x, name, dtype=dtype, device=device)
    if t.ndim == 1 and num_tokens is not None and t.shape[0] == num_tokens:
        raise ValueError(
            f"{name} must be 2-D with shape (N, D); got a 1-D array of length {t.shape[0]}. "
            f"For a single observation pass {name}[None, :] (shape (1, {num_tokens}))."
        )
    if t.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D with shape (N, D) (one observation per row); "
            f"got shape {tuple(t.shape)}."
        )
    if t.shape[0] == 0:
        raise ValueError(f"{name} has no rows (N=0); pass at least one observation.")
    if num_tokens is not None and t.shape[1] != num_tokens:
        raise ValueError(
            f"{name} has D={t.shape[1]} columns but the model has D={num_tokens} tokens; "
            f"pass data with {num_tokens} columns."
        )
    if not torch.isfinite(t).all():
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(
            f"{name} contains {bad} NaN or infinite value(s); remove or impute them first."
        )
    return t


def check_mask(mask: Any, num_tokens: int, num_data: int | None = None,
               device: torch.device | str | None = None) -> torch.Tensor:
    """Validate a boolean mask of shape ``(D,)``, ``(B, D)`` or ``(B, N, D)``.

    True marks a masked (predicted) token. A ``(B, N, D)`` mask gives every
    datum its own masks; its N must match the data.
    """
    if not isinstance(mask, torch.Tensor):
        if isinstance(mask, np.ndarray):
            mask = torch.from_numpy(mask)
        else:
            raise TypeError(
                f"mask must be a bool torch.Tensor, got {type(mask).__name__}."
            )
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = masked), got {mask.dtype}; "
            "use mask.bool() or (mask != 0)."
        )
    if mask.ndim not in (1, 2, 3) or mask.shape[-1] != num_tokens:
        raise ValueError(
            f"mask must have shape (D,), (B, D) or (B, N, D) with D={num_tokens}; "
            f"got {tuple(mask.shape)}."
        )
    if mask.ndim == 3 and num_data is not None and mask.shape[1] != num_data:
        raise ValueError(
            f"a 3-D mask must have shape (B, N, D) with N={num_data} (one mask per datum); "
            f"got {tuple(mask.shape)}. Use a (B, D) mask to share masks across data."
        )
    return mask.to(device=device)


def _device_choices() -> str:
    """The valid device strings here, for messages."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = "'cpu'" + (f", 'cuda', 'cuda:0'..'cuda:{n - 1}'" if n else "")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out += ", 'mps'"
    return f"valid choices: {out}" + ("" if n else " (this machine has no CUDA device)")


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` that exists here, or a ValueError naming the choices.

    Accepts a ``torch.device`` or a string (``"cpu"``, ``"cuda"``, ``"cuda:1"``,
    ``"mps"``). Refuses an unknown name (``"gpu"``), CUDA without CUDA, a CUDA
    index beyond the devices present, and MPS where it is not available.
    """
    if isinstance(device, torch.device):
        d = device
    elif isinstance(device, str):
        try:
            d = torch.device(device.strip())
        except RuntimeError:
            raise ValueError(f"unknown device {device!r}; {_device_choices()}.") from None
    else:
        raise TypeError(f"device must be a string or torch.device, got {device!r}.")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available "
                             f"(torch.cuda.is_available() is False); {_device_choices()}.")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: there are {torch.cuda.device_count()} CUDA "
                             f"devices; {_device_choices()}.")
    elif d.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ValueError(f"device {device!r}: MPS is not available here; "
                             f"{_device_choices()}.")
    elif d.type != "cpu":
        raise ValueError(f"device {device!r} is not one this package runs on; "
                         f"{_device_choices()}.")
    return d


def check_context(context: Any, num_tokens: int) -> torch.Tensor:
    """The always-visible dimensions C of dense data, as a bool ``(D,)`` tensor (True = context).

    ``context`` is a boolean mask of length D or a sequence of distinct indices in
    ``[0, D)``. The scored dimensions T (the complement) must not be empty.
    """
    if isinstance(context, torch.Tensor):
        c = context.detach().cpu()
    else:
        try:
            c = torch.as_tensor(np.asarray(context))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"context must be a boolean mask of length {num_tokens} or a list "
                            f"of dimension indices; got {type(context).__name__}.") from exc
    if c.shape == (0,):  # no index (numpy reads [] as float64): nothing visible, unconditional
        c = c.long()
    if c.dtype == torch.bool:
        if c.shape != (num_tokens,):
            raise ValueError(f"a boolean context must have shape ({num_tokens},) (one entry per "
                             f"dimension, True = always visible); got {tuple(c.shape)}.")
        out = c.clone()
    elif c.ndim == 1 and not c.is_floating_point() and not c.is_complex():
        idx = c.long()
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= num_tokens):
            raise ValueError(f"context indices must lie in [0, {num_tokens}); got "
                             f"{idx.tolist()[:10]}.")
        if idx.unique().numel() != idx.numel():
            raise ValueError("context indices must be distinct.")
        out = torch.zeros(num_tokens, dtype=torch.bool)
        out[idx] = True
    else:
        raise TypeError(f"context must be a boolean mask of length {num_tokens} or a 1-D list "
                        f"of integer dimension indices; got dtype {c.dtype}, shape "
                        f"{tuple(c.shape)}.")
    if bool(out.all()):
        raise ValueError("context covers every dimension: nothing is left to score. Leave at "
                         "least one dimension out of the context.")
    return out


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an int after checking it is a positive integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r}.")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value}.")
    return int(value)


def check_rate(rate: Any, name: str = "rate") -> float:
    """Check a masking rate lies strictly inside (0, 1)."""
    if rate is None:
        raise ValueError(f"{name} is required, e.g. {name}=0.15 for BERT's 15% masking.")
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real):
        raise TypeError(f"{name} must be a float in (0, 1), got {rate!r}.")
    if not 0.0 < float(rate) < 1.0:
        raise ValueError(
            f"{name} must lie strictly between 0 and 1 (a fraction of tokens), got {rate}. "
            "For 15% masking pass 0.15."
        )
    return float(rate)


def check_size(m: Any, num_tokens: int, name: str = "M") -> int:
    """Check a mask size satisfies ``1 <= M <= D``."""
    if isinstance(m, bool) or not isinstance(m, numbers.Integral):
        raise TypeError(f"{name} must be an integer mask size, got {m!r}.")
    if not 1 <= int(m) <= num_tokens:
        raise ValueError(
            f"mask size {name}={m} is out of range: it must satisfy 1 <= {name} <= D={num_tokens} "
            "(M=0 masks nothing and scores nothing)."
        )
    return int(m)


def make_generator(seed: int | torch.Generator | None) -> torch.Generator:
    """Return a CPU ``torch.Generator`` from a seed, a generator, or None (fresh entropy)."""
    if isinstance(seed, torch.Generator):
        return seed
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, a torch.Generator or None, got {seed!r}.")
        g.manual_seed(int(seed))
    return g


# ---------------------------------------------------------------------- Monte Carlo options
class InvalidOptionError(ValueError, TypeError):
    """An option of the wrong type or value (a ValueError and a TypeError, as scikit-learn's
    ``InvalidParameterError``: callers catching either see it)."""


@dataclass(frozen=True)
class Interval:
    """Numbers of one kind (``numbers.Integral`` or ``numbers.Real``, never bool) in a range.

    ``closed`` says which ends belong to it: ``"both"``, ``"left"``, ``"right"`` or
    ``"neither"``; None for an end means unbounded. Real values must be finite.
    """

    kind: type
    low: float | None
    high: float | None
    closed: str = "both"
    #: why the range is what it is, said in the refusal
    note: str = ""

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool | np.bool_) or not isinstance(value, self.kind):
            return False
        v = float(value)
        if not math.isfinite(v):
            return False
        lo_ok = self.low is None or (v >= self.low if self.closed in ("both", "left")
                                     else v > self.low)
        hi_ok = self.high is None or (v <= self.high if self.closed in ("both", "right")
                                      else v < self.high)
        return lo_ok and hi_ok

    def __str__(self) -> str:
        return self._range() + (f" ({self.note})" if self.note else "")

    def _range(self) -> str:
        what = "an int" if self.kind is numbers.Integral else "a number"
        if self.kind is numbers.Integral and self.low == 1 and self.high is None:
            return "a positive integer"
        if self.kind is numbers.Integral and self.low == 0 and self.high is None:
            return "a non-negative int"
        if self.low is not None and self.high is not None:
            left = "[" if self.closed in ("both", "left") else "("
            right = "]" if self.closed in ("both", "right") else ")"
            return f"{what} in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            if self.low == 0 and self.closed in ("neither", "right"):
                return "a positive number" if self.kind is numbers.Real else what + " > 0"
            if self.low > 0 and self.kind is numbers.Real:
                what = "a positive number"
            return f"{what} {'>=' if self.closed in ('both', 'left') else '>'} {self.low:g}"
        assert self.high is not None
        return f"{what} {'<=' if self.closed in ('both', 'right') else '<'} {self.high:g}"


@dataclass(frozen=True)
class Options:
    """One of a few strings."""

    choices: tuple[str, ...]

    def holds(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.choices

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(c) for c in self.choices)


#: a seed: a non-negative int
SEED_INT = Interval(numbers.Integral, 0, None)


def _holds(constraint: Any, value: Any) -> bool:
    if constraint is None:
        return value is None
    if constraint == "boolean":
        return isinstance(value, bool | np.bool_)
    if constraint == "generator":
        return isinstance(value, torch.Generator)
    if constraint == "int sequence":  # one non-negative int per item (not a string)
        return (isinstance(value, Sequence | np.ndarray) and not isinstance(value, str | bytes)
                and all(SEED_INT.holds(v) for v in value))
    if constraint == "positive int sequence":
        return (isinstance(value, Sequence | np.ndarray) and not isinstance(value, str | bytes)
                and len(value) > 0 and all(Interval(numbers.Integral, 1, None).holds(v)
                                           for v in value))
    return bool(constraint.holds(value))


def _describe(constraint: Any) -> str:
    return {None: "None", "boolean": "bool (True or False)", "generator": "a torch.Generator",
            "int sequence": "a list of non-negative ints",
            "positive int sequence": "a list of positive integers"}.get(
        constraint, str(constraint)) if not isinstance(constraint, Interval | Options) \
        else str(constraint)


#: ``allocation``, at a target standard error: ``"neyman"``, draws over strata (sizes, rates,
#: a draw's rows) in proportion to each stratum's spread (Neyman), the spread from the rounds
#: so far (pooled over the data on dense data, over the call on ragged sequences and in
#: ``compare``); ``"uniform"``, the same draws in every stratum
ALLOCATIONS = ("neyman", "uniform")

#: The one table of the Monte Carlo options of every door (``estimate_lml``, ``mpt_curve``,
#: ``compare``, ``pll``): each name's allowed kinds of value (any one of them). A door that
#: allows more for a name says so in ``check_options(..., overrides=)``.
#: the smallest target standard error (nats) a Monte Carlo door takes: the square root of
#: float64's smallest normal number, so that the target variance target_se^2 is a float
#: (1e-300 squared is 0, and the plan's (se / target_se)^2 overflowed). A target above it but
#: beyond reach spends its cap and says so (stop_reason "budget")
MIN_TARGET_SE = math.sqrt(sys.float_info.min)

MONTE_CARLO_OPTIONS: dict[str, list[Any]] = {
    "num_masks": [Interval(numbers.Integral, 1, None)],
    "seed": [SEED_INT, "generator", None],
    "target_se": [Interval(numbers.Real, MIN_TARGET_SE, None, "left",
                           "a positive target whose square, the target variance, is a normal "
                           "float64"), None],
    "max_masks": [Interval(numbers.Integral, 1, None), None],
    "alpha": [Interval(numbers.Real, 0, 1, "neither")],
    "delta": [Interval(numbers.Real, 0, None, "left")],
    "rate": [Interval(numbers.Real, 0, 1, "neither"), None],
    "mask_size": [Interval(numbers.Integral, 1, None), None],
    "nominal_length": [Interval(numbers.Real, 0, None, "neither"), None],
    "token_budget": [Interval(numbers.Integral, 1, None), None],
    "batch_size": [Interval(numbers.Integral, 1, None), None],
    "chunk_size": [Interval(numbers.Integral, 1, None), None],
    "allocation": [Options(ALLOCATIONS), None],
    **{flag: ["boolean"] for flag in ("decide", "common_masks", "progress", "share_masks",
                                      "nested", "cumulative", "whole_word", "per_token")},
}


def check_options(where: str, overrides: Mapping[str, list[Any]] | None = None,
                  **values: Any) -> None:
    """Refuse any option whose value is not one its constraint allows, naming it.

    Each keyword of ``values`` is looked up in :data:`MONTE_CARLO_OPTIONS`
    (``overrides`` replaces a door's own entries); a value must satisfy one of
    the constraints listed for its name: an :class:`Interval` (numbers of one
    kind, never bool, finite, in a range), :class:`Options` (strings),
    ``"boolean"`` (``True``/``False`` only: ``"false"`` is not False),
    ``"generator"``, ``"int sequence"`` (one non-negative int per item; a
    string is not one), or None.

    Raises
    ------
    InvalidOptionError
        (a ValueError and a TypeError) ``"{where}: {name} must be {what}, got {value!r}."``
    """
    table = {**MONTE_CARLO_OPTIONS, **(overrides or {})}
    for name, value in values.items():
        allowed = table[name]
        if any(_holds(c, value) for c in allowed):
            continue
        what = " or ".join(_describe(c) for c in allowed)
        hint = ""
        if isinstance(value, str) and "boolean" in allowed:
            hint = f" (the string {value!r} is not a bool: pass True or False)"
        elif isinstance(value, str):
            hint = " (a string is not a number: pass the value itself)"
        elif isinstance(value, bool) and "boolean" not in allowed:
            hint = " (a bool is not a number here)"
        raise InvalidOptionError(f"{where}: {name} must be {what}, got {value!r}{hint}.")


def check_checkpoint_dir(path: Any, where: str) -> None:
    """Refuse a ``checkpoint_dir`` that cannot be a folder of checkpoints, before any work.

    It must be a path (str or ``os.PathLike``) naming a folder, or a place where one can be
    made: not an existing file, not below a file, and in a writable folder.
    """
    if path is None:
        return
    if not isinstance(path, str | os.PathLike) or isinstance(path, bytes):
        raise TypeError(f"{where}: checkpoint_dir must be a folder path (str or Path), got "
                        f"{type(path).__name__}.")
    target = os.path.abspath(os.fspath(path))
    probe = target
    while not os.path.exists(probe):  # the nearest part of the path that exists
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(probe) and not os.path.isdir(probe):
        what = "is a file" if probe == target else f"lies below the file {probe}"
        raise ValueError(f"{where}: checkpoint_dir={os.fspath(path)!r} {what}; checkpoints are "
                         "written to a folder (made when missing): pass a folder path.")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: checkpoint_dir={os.fspath(path)!r} cannot be written "
                         f"({probe} is not writable); pass a folder you can write to.")
