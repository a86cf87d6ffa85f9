"""Files: the one atomic writer, and JSON conversion of tensors, arrays and dataclasses.

Every file the package writes (results, CSVs, figures, checkpoints, reports,
training histories) goes through :func:`atomic_write_bytes`: the bytes are
written to a hidden temporary file in the target's directory, flushed to disk,
and renamed over the target, so a reader sees the old file or the new one,
never a partial one. The temporary file is created with mode ``0o666`` minus
the process umask, like ``open(path, "w")`` (``tempfile.mkstemp`` would force
0600).

This module sits at the bottom of the package: it imports nothing of mptlml.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["atomic_save_npz", "atomic_write_bytes", "atomic_write_text", "jsonable"]


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and an atomic rename.

    The parent directory is created when missing. The file's mode follows the
    umask. On any error (including KeyboardInterrupt) the temporary file is
    removed and ``path`` is left as it was.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Atomic text write (UTF-8); see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save_npz(path: str | os.PathLike, arrays: Mapping[str, Any]) -> Path:
    """Atomic ``numpy.savez`` of ``arrays`` (no pickled objects); see :func:`atomic_write_bytes`."""
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return atomic_write_bytes(path, buf.getvalue())


def jsonable(obj: Any) -> Any:
    """Convert tensors, arrays, dataclasses and paths to JSON-ready values (NaN -> None)."""
    try:
        import numpy as np
        import torch
    except ImportError:  # pragma: no cover
        np = torch = None  # type: ignore[assignment]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj))
    if torch is not None and isinstance(obj, torch.Tensor):
        return jsonable(obj.detach().cpu().tolist())
    if np is not None and isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if np is not None and isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj
