"""The settings of a run as data: each ``--set`` key is a dataclass field described by its metadata.

The convention every job's ``Config`` follows (new parts and jobs too)
-----------------------------------------------------------------------
A ``Config`` is a ``@dataclass`` that subclasses :class:`RunConfig`
(directly or through a shared base such as
:class:`mptlml.jobs.curve.MLMRunConfig`) and declares each setting with
:func:`setting`::

    @dataclass
    class Config(RunConfig):
        num_masks: int = setting(1, "P, masks per rate and sequence", min=1)
        noise: str = setting("independent", "noise generator", choices=("independent", "shared"))
        curve_every: int = setting(10, "epochs between curves", min=1)
        num_threads: int | None = setting(None, "torch threads", min=1, execution=True)

        @classmethod
        def quick(cls) -> Config: ...        # small sizes for tests and `--quick`

        def validate(self) -> None:          # only checks that relate several fields
            super().validate()
            ...

The metadata keys are ``help`` (one line, shown by ``--show-config``),
``min``/``max`` (inclusive bounds of a number, or of each element of a tuple),
``gt``/``lt`` (exclusive bounds: ``gt=0`` a positive number, ``gt=0, lt=1`` a rate),
``choices`` (allowed values of a string, or of each element of a tuple),
``execution`` (the setting changes how the run executes, never a number it
computes: :func:`execution_settings`) and ``required`` (a job's command line
must give it). The same metadata drives ``mptlml reproduce NAME
--show-config``, the parsing of ``--set KEY=VALUE`` (:func:`parse_setting`, by
the field's type hint), the command-line flags of the jobs (``mptlml curve
--num-masks 2`` is the setting ``num_masks``) and the checks
(:func:`check_settings`): they run when a Config is constructed
(``__post_init__``, so also after :func:`dataclasses.replace`) and once more
in :func:`validate_config`, before a run directory exists.

A group of settings shared by several jobs (the masked-LM runs:
:class:`~mptlml.jobs.curve.MLMRunConfig`) is declared once, as a base class; a
job that needs another default for one of them says so with :func:`redefault`,
which keeps the declaration's help and bounds.

Key names mean the same in every job: ``seed`` is the base seed of the
run's randomness (masks, and initialisations unless ``init_seed`` is given;
``mptlml reproduce --seed N`` sets it), ``data_seed`` the seed of generated
data, ``num_seeds`` repetitions over mask seeds, ``num_inits`` random
initialisations, ``num_masks``/``max_masks`` P and its largest value,
``num_data`` N, ``num_tokens`` D, ``latent_dim`` K, ``num_sequences`` the
first N texts scored (``mptlml curve --num-sequences``), ``epochs`` full-batch
epochs, ``num_threads`` torch's intra-op threads. A prefix groups the settings
of one part of a job (``vae_*``, ``linear_*``, ``mpt_*``, ``curve_*``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from typing import Any

from .._validation import parse_flag

__all__ = [
    "RunConfig",
    "apply_overrides",
    "check_settings",
    "check_value",
    "describe_settings",
    "execution_settings",
    "format_value",
    "optional_inner",
    "parse_setting",
    "read_value",
    "redefault",
    "resolve_key",
    "setting",
    "type_name",
    "validate_config",
]


def setting(default: Any, help: str, *, min: float | None = None,  # noqa: A002
            max: float | None = None, gt: float | None = None,  # noqa: A002
            lt: float | None = None, choices: tuple[Any, ...] | None = None,
            execution: bool = False, required: bool = False) -> Any:
    """A dataclass field for one setting of a run, with its ``--set`` metadata.

    Parameters
    ----------
    default
        The paper's value (immutable: tuples, not lists).
    help : str
        One line saying what the setting means.
    min, max : number, optional
        Inclusive bounds (of each element, for a tuple).
    gt, lt : number, optional
        Exclusive bounds (``gt=0``: a positive number; ``gt=0, lt=1``: a rate).
    choices : tuple, optional
        Allowed values (of each element, for a tuple).
    execution : bool
        The setting changes how the run executes (threads, worker processes,
        progress bars, device, batch sizes, ...), never a number it computes:
        see :func:`execution_settings`.
    required : bool
        The job's command line must give it (``mptlml curve --model``).
    """
    meta = {"help": help, "min": min, "max": max, "gt": gt, "lt": lt, "choices": choices,
            "execution": execution, "required": required}
    return dataclasses.field(default=default, metadata=meta)


def redefault(base: type, name: str, default: Any) -> Any:
    """The setting ``name`` declared by ``base``, with another ``default`` (help and bounds kept).

    For a job whose default differs from the shared declaration's, e.g. the
    antibody reproduction scores the PLL by default::

        pll: bool = redefault(MLMRunSettings, "pll", True)
    """
    meta = _fields(base)[name].metadata
    return dataclasses.field(default=default, metadata=meta)


class RunConfig:
    """Base of every job's ``Config`` dataclass: checks the settings when built."""

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def quick(cls) -> Any:
        """Small sizes for tests and ``--quick`` (subclasses override; default: the paper's)."""
        return cls()

    def validate(self) -> None:
        """Checks that relate several settings (subclasses extend it; ranges are metadata)."""
        check_settings(self)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def execution_settings(cls: type) -> frozenset[str]:
    """The settings of ``cls`` that change how a run executes, never a number it computes.

    Declared with ``setting(..., execution=True)``: torch threads, worker
    processes, progress bars, the device, the batch and chunk sizes of
    masked-LM scoring. Their values are recorded in results.json like every
    setting, but the report leaves them out of a run's sizes, ``reproduce all
    --resume`` keeps a part that finished with other values of them, and
    ``--show-config`` marks them.
    """
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("execution"))


def type_name(t: Any) -> str:
    """A type hint as the messages show it: ``int``, ``int | None``, ``tuple[int, ...]``."""
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "").replace("NoneType", "None")


def optional_inner(t: Any) -> Any | None:
    """``T`` of ``T | None``, else None."""
    args = typing.get_args(t)
    if (typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args
            and len(args) == 2):
        return next(a for a in args if a is not type(None))
    return None


def check_value(name: str, value: Any, t: Any, meta: dict[str, Any], shown: Any) -> None:
    """Check one value (or one tuple element) against its type and metadata."""
    inner = optional_inner(t)
    if inner is not None:
        if value is None:
            return
        t = inner
    origin = typing.get_origin(t)
    if origin in (tuple, list):
        if not isinstance(value, tuple | list):
            raise ValueError(f"{name} must be a comma-separated list, got {value!r}.")
        elem = (typing.get_args(t) or (Any,))[0]
        for v in value:
            check_value(name, v, elem, meta, shown)
        return
    if t is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}.")
        return
    if t is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {shown!r}.")
    elif t is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name} must be a number, got {shown!r}.")
        if not math.isfinite(value):
            what = "a finite positive number" if meta.get("gt") == 0 else "finite"
            raise ValueError(f"{name} must be {what}, got {shown!r}.")
    elif t is str and not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {shown!r}.")
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    gt, lt = meta.get("gt"), meta.get("lt")
    if gt == 0 and lt == 1 and not 0 < value < 1:
        raise ValueError(f"{name} must lie strictly between 0 and 1 (a rate), got {shown!r}.")
    if gt is not None and not value > gt:
        what = "a finite positive number (> 0)" if gt == 0 else f"> {gt}"
        raise ValueError(f"{name} must be {what}, got {shown!r}.")
    if lt is not None and not value < lt:
        raise ValueError(f"{name} must be < {lt}, got {shown!r}.")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {shown!r}.")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {shown!r}.")
    if choices is not None and value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}; got {shown!r}.")


def check_settings(cfg: Any) -> None:
    """Check every field of a Config against its type hint and metadata (``min``, ...).

    Raises
    ------
    ValueError
        Naming the key and the value, e.g. ``num_sequences must be >= 1, got -3``.
    """
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        check_value(f.name, value, hints.get(f.name, Any), dict(f.metadata), value)


def validate_config(cfg: Any) -> None:
    """All checks of a Config: the per-field metadata, then its own ``validate()``."""
    check_settings(cfg)
    if hasattr(cfg, "validate"):
        cfg.validate()


def resolve_key(cls: type, key: str, *, where: str = "") -> str:
    """``key`` when ``cls`` has such a setting; otherwise an error listing the valid ones."""
    fields = _fields(cls)
    if key in fields:
        return key
    raise ValueError(f"unknown setting {key!r}{where}; valid settings: {', '.join(fields)} "
                     "(see --show-config).")


def parse_setting(cls: type, text: str, *, where: str = "") -> tuple[str, Any]:
    """``"KEY=VALUE"`` to ``(key, value)``, the value read by the field's type hint.

    Lists are comma-separated (``dims=5,50``); ``none`` is None for optional
    settings; booleans are true/false, yes/no, 1/0. The value is checked against
    the field's metadata here, so a bad one is reported with the text given.
    """
    if "=" not in text:
        raise ValueError(f"--set expects KEY=VALUE, got {text!r}.")
    key, raw = text.split("=", 1)
    key = resolve_key(cls, key.strip(), where=where)
    typ = _hints(cls).get(key, str)
    try:
        value = read_value(raw.strip(), typ)
    except ValueError:
        raise ValueError(f"cannot read {key}={raw!r}{where} as {type_name(typ)}.") from None
    check_value(key, value, typ, dict(_fields(cls)[key].metadata), raw)
    return key, value


def read_value(raw: str, typ: Any) -> Any:
    """The text of a value (``--set`` or a flag) read by its type hint; ValueError if unreadable."""
    inner = optional_inner(typ)
    if inner is not None:
        return None if raw.lower() == "none" else read_value(raw, inner)
    origin = typing.get_origin(typ)
    if origin in (tuple, list):
        elem = (typing.get_args(typ) or (str,))[0]
        return origin(read_value(p.strip(), elem) for p in raw.split(",") if p.strip())
    if typ is bool:
        return parse_flag(raw, "a yes/no setting")
    if typ is int:
        return int(raw)
    if typ is float:
        return float(raw)
    return raw


def apply_overrides(cfg: Any, overrides: dict[str, Any] | None, *, name: str = "") -> Any:
    """``cfg`` with ``overrides`` applied (unknown keys refused), checked."""
    if not overrides:
        return cfg
    where = f" for {name}" if name else ""
    resolved = {resolve_key(type(cfg), k, where=where): v for k, v in overrides.items()}
    return dataclasses.replace(cfg, **resolved)


def describe_settings(cls: type) -> list[dict[str, Any]]:
    """One row per setting: key, type, default, quick value and meaning (``--show-config``)."""
    hints = _hints(cls)
    default, quick = cls(), cls.quick() if hasattr(cls, "quick") else cls()
    rows = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        bounds = []
        for key, op in (("gt", ">"), ("min", ">="), ("lt", "<"), ("max", "<=")):
            if meta.get(key) is not None:
                bounds.append(f"{op} {meta[key]}")
        if meta.get("choices"):
            bounds.append("one of " + "/".join(map(str, meta["choices"])))
        text = meta.get("help", "")
        if bounds:
            text += f" [{', '.join(bounds)}]"
        if meta.get("execution"):
            text += " (execution only: no number depends on it)"
        rows.append({"key": f.name, "type": type_name(hints.get(f.name, Any)),
                     "default": format_value(getattr(default, f.name)),
                     "quick": format_value(getattr(quick, f.name)), "meaning": text})
    return rows


def format_value(v: Any) -> str:
    """A setting's value as ``--set`` would take it (lists comma-separated, booleans lower-case)."""
    if isinstance(v, tuple | list):
        return ",".join(map(str, v))
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)
