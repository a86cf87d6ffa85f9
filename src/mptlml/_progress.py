"""Progress bars and output control: every bar of the package goes through :func:`progress_bar`.

A bar is shown only when all of these allow it:

- the caller asks for it (``enabled``, e.g. ``progress=True`` of an estimator);
- the process is not quiet (:func:`set_quiet`, which ``mptlml --quiet`` calls);
- the environment variable ``TQDM_DISABLE`` is unset or says no (``0``/``false``/``no``/
  ``off``; any other value than a yes or a no is refused).

tqdm reads ``TQDM_DISABLE`` only when ``disable`` is not passed; passing it
explicitly (as the package once did) overrode the user's choice, hence this
one helper.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from ._validation import env_flag

__all__ = ["is_quiet", "progress_bar", "progress_enabled", "set_quiet"]

_QUIET = False


#: environment switches of the Hugging Face libraries, read when they are imported
_HF_QUIET = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
             "TRANSFORMERS_VERBOSITY": "error"}
_SET_BY_US: set[str] = set()


def set_quiet(quiet: bool = True) -> None:
    """Turn every progress bar of the package off (``True``) or back on, process-wide.

    Quiet also silences the loading bars and advisory messages of
    ``transformers``, ``huggingface_hub`` and ``datasets``: through their
    environment switches (read when they are imported, so the command line does
    not import them just for this) and, when they are already imported, their
    own functions. ``False`` undoes what ``True`` did.
    """
    global _QUIET
    _QUIET = bool(quiet)
    for key, value in _HF_QUIET.items():
        if quiet and key not in os.environ:
            os.environ[key] = value
            _SET_BY_US.add(key)
        elif not quiet and key in _SET_BY_US:
            os.environ.pop(key, None)
            _SET_BY_US.discard(key)
    if "transformers" in sys.modules:
        import transformers.utils.logging as hf_logging

        if quiet:
            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
        else:
            hf_logging.enable_progress_bar()
            hf_logging.set_verbosity_warning()
    if "datasets" in sys.modules:
        import datasets

        (datasets.disable_progress_bars if quiet else datasets.enable_progress_bars)()


def is_quiet() -> bool:
    """Whether :func:`set_quiet` turned the bars off."""
    return _QUIET


def _env_disabled() -> bool:
    return env_flag("TQDM_DISABLE", False)


def progress_enabled(enabled: bool = True) -> bool:
    """Whether a bar asked for with ``enabled`` is shown (quiet and ``TQDM_DISABLE`` win)."""
    return bool(enabled) and not _QUIET and not _env_disabled()


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True,
                 desc: str | None = None, total: int | None = None, leave: bool = False,
                 **kwargs: Any) -> Any:
    """A ``tqdm.auto.tqdm`` bar that honours ``--quiet`` and ``TQDM_DISABLE``.

    Parameters
    ----------
    iterable : iterable, optional
        What to iterate over (or None for a manual bar updated with ``.update(n)``).
    enabled : bool
        The caller's wish (its ``progress=`` argument); a disabled bar still
        iterates and accepts ``update``/``set_postfix`` as no-ops.
    desc : str, optional
        Passed to tqdm.
    total : int, optional
        Passed to tqdm.
    leave : bool
        Passed to tqdm.
    **kwargs
        Passed to tqdm.
    """
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=leave,
                disable=not progress_enabled(enabled), **kwargs)
