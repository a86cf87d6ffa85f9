"""Experiment settings as data: each ``--set`` key is a dataclass field described by its metadata.

The convention every experiment's ``Config`` follows (new experiments too)
---------------------------------------------------------------------------
A ``Config`` is a ``@dataclass`` that subclasses :class:`ExperimentConfig`
(directly or through :class:`~._synthetic.SyntheticPPCAConfig`) and declares
each setting with :func:`setting`::

    @dataclass
    class Config(ExperimentConfig):
        num_masks: int = setting(1, "P, masks per rate and sequence", min=1)
        noise: str = setting("independent", "noise generator", choices=("independent", "shared"))
        every: int = setting(10, "epochs between curves", min=1)

        @classmethod
        def quick(cls) -> Config: ...        # small sizes for tests and `--quick`

        def validate(self) -> None:          # only checks that relate several fields
            super().validate()
            ...

The metadata keys are ``help`` (one line, shown by ``--show-config``),
``min``/``max`` (inclusive bounds of a number, or of each element of a tuple),
``gt``/``lt`` (exclusive bounds: ``gt=0`` a positive number, ``gt=0, lt=1`` a rate),
and ``choices`` (allowed values of a string, or of each element of a tuple).
The same metadata drives ``mptlml reproduce NAME --show-config``, the parsing
of ``--set KEY=VALUE`` (:func:`parse_setting`, by the field's type hint), the
command-line flags of the jobs (:func:`add_flags`: ``mptlml curve
--num-masks 2`` is the setting ``num_masks``) and the checks
(:func:`check_settings`): they run when a Config is constructed
(``__post_init__``, so also after :func:`dataclasses.replace`) and once more
in :func:`validate_config`, before a run directory exists.

A group of settings shared by several jobs (the masked-LM runs:
:class:`~.mlm.MLMRunSettings`) is declared once, as a base class; a job that
needs another default for one of them says so with :func:`redefault`, which
keeps the declaration's help and bounds.

Key names mean the same in every experiment: ``seed`` is the base seed of the
run's randomness (masks, and initialisations unless ``init_seed`` is given;
``mptlml reproduce --seed N`` sets it), ``data_seed`` the seed of generated
data, ``num_seeds`` repetitions over mask seeds, ``num_inits`` random
initialisations, ``num_masks``/``max_masks`` P and its largest value,
``num_data`` N, ``num_tokens`` D, ``latent_dim`` K, ``num_sequences`` the
first N texts scored (``mptlml curve --num-sequences``), ``epochs`` full-batch
epochs. A prefix groups the settings of one part of an experiment
(``vae_*``, ``linear_*``, ``mpt_*``, ``curve_*``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Sequence
from typing import Any

from .._validation import parse_flag

__all__ = [
    "ExperimentConfig",
    "add_flags",
    "apply_overrides",
    "check_settings",
    "check_value",
    "describe_settings",
    "flag_overrides",
    "format_value",
    "parse_setting",
    "redefault",
    "resolve_key",
    "scoped_overrides",
    "setting",
    "validate_config",
]


def setting(default: Any, help: str, *, min: float | None = None,  # noqa: A002
            max: float | None = None, gt: float | None = None,  # noqa: A002
            lt: float | None = None, choices: tuple[Any, ...] | None = None) -> Any:
    """A dataclass field for one experiment setting, with its ``--set`` metadata.

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
    """
    meta = {"help": help, "min": min, "max": max, "gt": gt, "lt": lt, "choices": choices}
    return dataclasses.field(default=default, metadata=meta)


def redefault(base: type, name: str, default: Any) -> Any:
    """The setting ``name`` declared by ``base``, with another ``default`` (help and bounds kept).

    For a job whose default differs from the shared declaration's, e.g. the
    antibody reproduction scores the PLL by default::

        pll: bool = redefault(MLMRunSettings, "pll", True)
    """
    meta = _fields(base)[name].metadata
    return dataclasses.field(default=default, metadata=meta)


class ExperimentConfig:
    """Base of the experiments' ``Config`` dataclasses: checks the settings when built."""

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


def _type_name(t: Any) -> str:
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "").replace("NoneType", "None")


def _optional_inner(t: Any) -> Any | None:
    """``T`` of ``T | None``, else None."""
    args = typing.get_args(t)
    if (typing.get_origin(t) in (typing.Union, types.UnionType) and type(None) in args
            and len(args) == 2):
        return next(a for a in args if a is not type(None))
    return None


def check_value(name: str, value: Any, t: Any, meta: dict[str, Any], shown: Any) -> None:
    """Check one value (or one tuple element) against its type and metadata."""
    inner = _optional_inner(t)
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
        value = _convert(raw.strip(), typ)
    except ValueError:
        raise ValueError(f"cannot read {key}={raw!r}{where} as {_type_name(typ)}.") from None
    check_value(key, value, typ, dict(_fields(cls)[key].metadata), raw)
    return key, value


def _convert(raw: str, typ: Any) -> Any:
    inner = _optional_inner(typ)
    if inner is not None:
        return None if raw.lower() == "none" else _convert(raw, inner)
    origin = typing.get_origin(typ)
    if origin in (tuple, list):
        elem = (typing.get_args(typ) or (str,))[0]
        return origin(_convert(p.strip(), elem) for p in raw.split(",") if p.strip())
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
        rows.append({"key": f.name, "type": _type_name(hints.get(f.name, Any)),
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


def scoped_overrides(names: list[str], texts: list[str], *, seed: int | None = None,
                     reference: str | None = None) -> dict[str, dict[str, Any]]:
    """``reproduce``'s ``--set`` / ``--seed`` / ``--reference`` as ``{experiment: {key: value}}``.

    For one experiment every ``KEY=VALUE`` must be one of its settings. For
    ``all``, ``NAME.KEY=VALUE`` sets KEY of experiment NAME and a bare
    ``KEY=VALUE`` sets KEY of every experiment that has it (refused when none has).
    """
    from .registry import get_experiment

    configs = {n: get_experiment(n).Config for n in names}
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    texts = list(texts)
    if seed is not None:
        texts.append(f"seed={seed}")
    if reference:
        with_ref = [n for n in names if "reference" in _keys(configs[n])]
        if not with_ref:
            raise ValueError(f"--reference does not apply to {names[0]}; it is for bert.")
        texts += [f"{n}.reference={reference}" for n in with_ref] if len(names) > 1 else \
            [f"reference={reference}"]
    for text in texts:
        key = text.split("=", 1)[0]
        target, _, bare = key.partition(".")
        if bare and target in configs:
            scope, text = [target], text[len(target) + 1:]
        elif len(names) > 1:
            scope = [n for n in names if _has_key(configs[n], key)]
            if not scope:
                raise ValueError(f"no experiment has a setting {key!r}; use NAME.KEY=VALUE with "
                                 "a NAME of `mptlml reproduce --help`, or see --show-config.")
        else:
            scope = names
        for n in scope:
            where = f" for {n}" if len(names) > 1 else ""
            k, v = parse_setting(configs[n], text, where=where)
            if k in out[n] and out[n][k] != v:
                raise ValueError(f"{k}{where} is set twice ({out[n][k]!r} and {v!r}); "
                                 "give it once.")
            out[n][k] = v
    return out


def _keys(cfg_cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cfg_cls)}


def _has_key(cfg_cls: type, key: str) -> bool:
    return key in _keys(cfg_cls)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(parser: Any, cls: type, *, only: Sequence[str] | None = None,
              required: Sequence[str] = ()) -> None:
    """Add one command-line flag per setting of ``cls`` (``num_masks`` -> ``--num-masks``).

    The flags are the settings: same names, the same reading as ``--set``
    (:func:`parse_setting`), the help and bounds of :func:`setting`, the
    default of ``cls``. A boolean is ``--NAME/--no-NAME``. A flag not given
    leaves the setting at its default; :func:`flag_overrides` collects the given
    ones and checks them, naming the flag.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    cls : a Config dataclass
    only : the settings to expose (default: every one)
    required : settings the command line must give
    """
    import argparse

    hints, fields, default = _hints(cls), _fields(cls), cls()
    for name in only if only is not None else list(fields):
        f, typ = fields[name], hints.get(name, str)
        meta, value = f.metadata, getattr(default, name)
        text = meta.get("help", "")
        if name not in required and "default" not in text:
            text += f" (default {format_value(value) if value is not None else 'none'})"
        text = text.replace("%", "%%")
        inner = _optional_inner(typ) or typ
        if inner is bool:
            parser.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=text)
            continue

        def read(raw: str, typ: Any = typ) -> Any:
            return _convert(raw.strip(), typ)

        read.__name__ = _type_name(inner)  # argparse names the type in its messages
        parser.add_argument(_flag(name), dest=name, type=read, default=argparse.SUPPRESS,
                            required=name in required, help=text,
                            choices=meta.get("choices") if inner is str else None,
                            metavar=None if meta.get("choices") and inner is str
                            else name.upper())


def flag_overrides(args: Any, cls: type, *, only: Sequence[str] | None = None
                   ) -> dict[str, Any]:
    """The settings of ``cls`` given as flags (see :func:`add_flags`), checked, naming the flag."""
    hints, out = _hints(cls), {}
    for f in dataclasses.fields(cls):
        if (only is None or f.name in only) and hasattr(args, f.name):
            value = getattr(args, f.name)
            check_value(_flag(f.name), value, hints.get(f.name, Any), dict(f.metadata), value)
            out[f.name] = value
    return out
