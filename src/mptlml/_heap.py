"""Keep freed memory in the process heap during blocked computations (glibc only).

The estimators score masks in blocks, and each block allocates and frees the
same few large temporaries. glibc hands big freed blocks back to the kernel
(``munmap``, or a trim of the heap top), so the next block faults the pages in
again. On a 2-core VM that cost about 1 us per 4 KiB page: 5,800 faults and
about a third of a PPCA estimate at D = 50 (``benchmarks/bench_estimators.py``
prints the fault count).

:func:`keep_heap` sets glibc's mmap and trim thresholds to the ceiling that its
own dynamic adjustment reaches on 64-bit systems (32 MiB and 64 MiB; see
``mallopt(3)``), so that up to 64 MiB of freed memory is reused instead of
returned. It changes the whole process, so the library never calls it: the
``mptlml`` command line and the benchmarks opt in once at start-up, and a
library user calls ``mptlml.settings.keep_heap()``. Set the environment
variable ``MPTLML_KEEP_HEAP=0`` (or ``false``, ``no``, ``off``, any case) to
leave the allocator alone even then; other C libraries (musl, macOS, Windows)
are never touched.
"""

from __future__ import annotations

import ctypes
import sys

from ._validation import env_flag

__all__ = ["heap_kept", "keep_heap"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit, and twice it for the trim (as glibc does)
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 64 << 20

_state: dict[str, bool] = {}


def keep_heap() -> bool:
    """Raise glibc's mmap/trim thresholds once per process; True when they are set.

    A no-op (False) off glibc, when ``MPTLML_KEEP_HEAP`` says no, or when ``mallopt``
    refuses the values.
    """
    if "kept" not in _state:
        _state["kept"] = _set_thresholds()
    return _state["kept"]


def heap_kept() -> bool:
    """Whether :func:`keep_heap` has set the thresholds in this process."""
    return _state.get("kept", False)


def _set_thresholds() -> bool:
    if not env_flag("MPTLML_KEEP_HEAP", True):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl has mallopt as a stub)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
