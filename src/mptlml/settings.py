"""Scoped settings of the scoring machinery, in the style of ``gpytorch.settings``.

Each setting is a context manager that changes a value for the code inside its
``with`` block and restores the previous value on exit (also on an error);
``setting.value()`` reads the value in force::

    import mptlml
    with mptlml.settings.block_elements(1 << 20):   # smaller blocks, less memory
        est = mptlml.estimate_lml(model, x, num_masks=100)

``block_elements``  elements (masks x data x tokens) of temporaries per model
                    call; bounds the memory of a block of masks.
``mask_bytes``      bytes of masks drawn in one call by the grid scorer (several
                    blocks at once: fewer, larger draws on the mask threads).
``max_masks``       default cap on the masked inputs per datum (sequence) the
                    exhaustive estimator scores (2^D - 1 each; refused past it).
``max_masked_inputs`` cap on the masked inputs one run (ragged sequences or dense
                    data, a planned target included) may score (a run past it is
                    refused up front, with its cost).

They change how the work is cut, not what is estimated: the masks of one block
(or group of blocks) are drawn in one call, so with other block sizes a seed
maps to other masks, and the numbers move within their Monte Carlo error
(``tests/test_ppca.py`` checks the estimate). For given settings a seed gives
the same numbers every time.

:func:`keep_heap` is a process-wide allocator setting and therefore not scoped:
it raises glibc's mmap/trim thresholds so that the estimators' freed
temporaries stay in the heap instead of being faulted in again for every block
(a third of a D = 50 PPCA estimate on a 2-core VM; see ``mptlml._heap``). The
library never calls it; the ``mptlml`` command line and the benchmarks opt in
once at start-up, and a library user who wants it calls
``mptlml.settings.keep_heap()`` once.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, ClassVar

from ._heap import heap_kept, keep_heap
from ._validation import check_positive_int

__all__ = ["block_elements", "heap_kept", "keep_heap", "mask_bytes", "max_masked_inputs",
           "max_masks"]


class _ValueContext:
    """A positive-integer setting: ``value()`` reads it, ``with cls(v):`` scopes it."""

    _global_value: ClassVar[int]

    @classmethod
    def value(cls) -> int:
        """The value in force."""
        return cls._global_value

    def __init__(self, value: int) -> None:
        self._value = check_positive_int(value, type(self).__name__)
        self._saved: list[int] = []

    def __enter__(self) -> _ValueContext:
        self._saved.append(type(self)._global_value)
        type(self)._global_value = self._value
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        type(self)._global_value = self._saved.pop()

    def __repr__(self) -> str:
        return f"mptlml.settings.{type(self).__name__}({self._value})"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.default = cls._global_value  # type: ignore[attr-defined]


class block_elements(_ValueContext):  # noqa: N801 - GPyTorch-style lower-case settings
    """Elements (masks x data x tokens) of temporaries per model call (default 2^22)."""

    _global_value = 1 << 22


class mask_bytes(_ValueContext):  # noqa: N801
    """Bytes of masks drawn in one call by the grid scorer (default 2^25)."""

    _global_value = 1 << 25


class max_masked_inputs(_ValueContext):  # noqa: N801
    """Cap on the masked inputs one run (ragged or dense) may score (default 10^7)."""

    _global_value = 10_000_000


class max_masks(_ValueContext):  # noqa: N801
    """Default cap on the masked inputs per datum (sequence) the exhaustive estimator scores,
    its 2^D - 1 masks (2^16; data needing more are refused). The unit of every ``max_masks``:
    masked inputs per datum, sequence or candidate."""

    _global_value = 1 << 16
