"""Run directories as transactions: a staging directory, a lock, an atomic swap.

A run never writes into its ``--out`` directory ``OUT`` directly. While it
runs it holds an exclusive lock on ``.OUT.lock`` beside ``OUT`` and writes
into the hidden staging directory ``.OUT.partial`` beside it (same parent, so
same file system). Only when the run succeeds (``results.json`` written) is
the staging directory swapped in, after hard links to whatever ``OUT`` holds
that no run wrote (the user's own files: anything but results.json,
``checkpoint/`` and the files that results.json lists) were added to it:

1. on Linux, ``renameat2(RENAME_EXCHANGE)`` swaps the two directories in one
   atomic step, and the old run (now under the staging name) is deleted;
2. elsewhere, or where the file system refuses the exchange, ``OUT`` is
   renamed to ``.OUT.old``, the staging directory to ``OUT``, and ``.OUT.old``
   is deleted. A process killed between these two renames leaves ``OUT``
   missing and ``.OUT.old`` present; the next run into ``OUT`` repairs it
   before doing anything else (it finishes the swap when the staging
   directory holds a finished run, i.e. its results.json, and otherwise puts
   the old run back) and says so on stderr.

A run that fails or is interrupted (an exception, Ctrl-C) leaves ``OUT``
exactly as it was, or absent when there was none. Its staging directory is
deleted, except the finished checkpoint chunks under ``checkpoint/`` (masked-LM
runs), which stay in ``.OUT.partial`` for ``--resume``; the next run without
``--resume`` deletes them. With ``--resume`` the staging directory starts from
those chunks or, when there are none, from hard links to the chunks of the
finished run in ``OUT`` (so ``OUT`` itself is never modified).

A second process that targets the same ``OUT`` while the lock is held is
refused at once with :class:`RunDirError`. The lock is a :class:`filelock.FileLock`
(an ``fcntl.flock`` on POSIX), so the operating system releases it when the
process exits or crashes; the lock file holds the holder's process id.

An ``OUT`` that is a symbolic link (or lies under one) is resolved first: the
run replaces the directory the link points to, and the lock, the staging
directory and the swap are all beside that directory, so two processes that
reach it by different names exclude each other and the link stays a link.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

_log = logging.getLogger(__name__)

__all__ = ["RunDirError", "Transaction", "lock_path", "locked", "resolve_out", "staging_path"]

#: the sub-directory of a run directory that survives a failed run (for --resume)
CHECKPOINT_DIR = "checkpoint"


class RunDirError(ValueError):
    """A run directory is in use, or cannot be created, replaced or repaired."""


def resolve_out(out: str | os.PathLike) -> Path:
    """``out`` as an absolute path with every symbolic link resolved (the directory a run replaces).

    Logs where the run goes when ``out`` itself is a link.
    """
    p = Path(os.path.realpath(out))
    if Path(out).is_symlink():
        _log.info("--out %s is a symbolic link to %s: the run goes there (the link stays).",
                  out, p)
    return p


def staging_path(out: str | os.PathLike) -> Path:
    """The hidden staging directory ``.OUT.partial`` beside ``out`` (links resolved)."""
    p = Path(os.path.realpath(out))
    return p.parent / f".{p.name}.partial"


def lock_path(out: str | os.PathLike) -> Path:
    """The lock file ``.OUT.lock`` beside ``out`` (links resolved)."""
    p = Path(os.path.realpath(out))
    return p.parent / f".{p.name}.lock"


def _aside_path(out: Path) -> Path:
    return out.parent / f".{out.name}.old"


class _Lock:
    """An exclusive, non-blocking :class:`filelock.FileLock` on ``.OUT.lock`` (released on exit)."""

    def __init__(self, out: Path) -> None:
        import filelock

        self.path, self.out = lock_path(out), out
        self._lock = filelock.FileLock(self.path, blocking=False, thread_local=False)

    def acquire(self) -> None:
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except filelock.Timeout:
            try:
                holder = self.path.read_text(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise RunDirError(
                f"{self.out} is being written by another mptlml process (pid {holder}, lock "
                f"{self.path}); wait for it to finish, or choose another --out directory."
            ) from None
        with contextlib.suppress(OSError):
            self.path.write_text(f"{os.getpid()}\n")

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()


@contextlib.contextmanager
def locked(out: str | os.PathLike) -> Iterator[None]:
    """Hold the lock of ``out`` (refusing at once if another process holds it)."""
    lock = _Lock(resolve_out(out))
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with Linux ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a tree of files as hard links (a plain copy across file systems)."""
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link)


def _rm(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _carry_over(old: Path, new: Path) -> None:
    """Hard-link into ``new`` what ``old`` holds that no mptlml run wrote (the user's files).

    The files of the old run (its results.json, checkpoints, and the files its
    results.json lists) are not carried over: nothing of the old run is left.
    """
    produced = {"results.json", CHECKPOINT_DIR}
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        listed = json.loads((old / "results.json").read_text()).get("files", [])
        produced |= {str(f) for f in listed}
    for entry in old.iterdir():
        target = new / entry.name
        if (entry.name in produced or target.exists() or target.is_symlink()
                or (entry.name.startswith(".") and entry.name.endswith(".tmp"))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            _link_tree(entry, target)
        elif entry.is_symlink():
            os.symlink(os.readlink(entry), target)
        else:
            try:
                os.link(entry, target)
            except OSError:
                shutil.copy2(entry, target)


def _repair(out: Path, staging: Path) -> None:
    """Finish or undo a swap that a killed process left between its two renames."""
    aside = _aside_path(out)
    if not aside.exists():
        return
    if out.exists():  # the swap happened; only the old run was not deleted yet
        _rm(aside)
        return
    if (staging / "results.json").is_file():
        os.rename(staging, out)
        _rm(aside)
        what = "finished the swap: the new run is in place"
    else:
        os.rename(aside, out)
        what = "put the previous run back"
    _log.warning("%s was left half-replaced by a process killed while swapping run "
                 "directories; %s.", out, what)


class _State:
    """What a finaliser needs to abandon an unfinished transaction (no reference to it)."""

    def __init__(self, staging: Path, lock: _Lock) -> None:
        self.staging, self.lock, self.done = staging, lock, False

    def abandon(self) -> None:
        """Drop the staging directory (keeping checkpoint chunks) and release the lock."""
        if self.done:
            return
        self.done = True
        try:
            if self.staging.is_dir():
                ckpt = self.staging / CHECKPOINT_DIR
                keep = ckpt.is_dir() and any(ckpt.rglob("chunk_*.npz"))
                for entry in list(self.staging.iterdir()):
                    if not (keep and entry.name == CHECKPOINT_DIR):
                        _rm(entry)
                if not keep:
                    self.staging.rmdir()
        finally:
            self.lock.release()


class Transaction:
    """Stage a run beside ``out`` under a lock; :meth:`commit` swaps it in.

    Parameters
    ----------
    out : path-like
        The run directory the user asked for.
    overwrite : bool
        Replace a non-empty ``out`` (only once the new run succeeds).
    resume : bool
        Start from the checkpoint chunks of an interrupted or finished run.
    worker : bool
        A non-main process of a data-parallel run: no lock, no setup, no
        commit; it writes its checkpoint chunks into the staging directory that
        the main process prepared.
    """

    def __init__(self, out: str | os.PathLike, *, overwrite: bool = False, resume: bool = False,
                 worker: bool = False) -> None:
        self.out = resolve_out(out) if not worker else Path(os.path.realpath(out))
        self.staging = staging_path(self.out)
        self._lock = _Lock(self.out)
        self._state = _State(self.staging, self._lock)
        if worker:
            self._state.done = True
            return
        if self.out.exists() and not self.out.is_dir():
            raise RunDirError(f"output path {out} exists and is not a directory.")
        cwd = Path.cwd()
        if cwd == self.out or self.out in cwd.parents:
            raise RunDirError(f"--out {out} is (or contains) the current directory; a run "
                              "replaces its directory as a whole, so choose a sub-directory.")
        self._lock.acquire()
        try:
            _repair(self.out, self.staging)
            if self.out.is_dir() and any(self.out.iterdir()) and not (overwrite or resume):
                raise RunDirError(
                    f"run directory {out} exists and is not empty; pass --overwrite to replace "
                    "its results (the old ones stay until the new run succeeds), or choose "
                    "another --out directory."
                )
            self._prepare_staging(resume)
        except BaseException:
            self._lock.release()
            raise
        self._finalizer = weakref.finalize(self, self._state.abandon)

    def _prepare_staging(self, resume: bool) -> None:
        ckpt = self.staging / CHECKPOINT_DIR
        if self.staging.exists() or self.staging.is_symlink():
            if resume and self.staging.is_dir():
                for entry in list(self.staging.iterdir()):
                    if entry.name != CHECKPOINT_DIR:
                        _rm(entry)
            else:
                _rm(self.staging)
        self.staging.mkdir(parents=True, exist_ok=True)
        old = self.out / CHECKPOINT_DIR
        if resume and not ckpt.exists() and old.is_dir():
            _link_tree(old, ckpt)

    @property
    def active(self) -> bool:
        """True until the transaction is committed or abandoned."""
        return not self._state.done

    def commit(self) -> Path:
        """Swap the staging directory in as ``out``, delete the old run, release the lock."""
        if self._state.done:
            raise RunDirError(f"run directory {self.out}: nothing to commit.")
        try:
            if not self.out.exists():
                os.rename(self.staging, self.out)
            else:
                _carry_over(self.out, self.staging)
                if _exchange(self.staging, self.out):
                    _rm(self.staging)  # holds the old run now
                else:
                    aside = _aside_path(self.out)
                    _rm(aside)
                    os.rename(self.out, aside)
                    os.rename(self.staging, self.out)  # killed before this: see _repair
                    _rm(aside)
            _fsync_dir(self.out.parent)
        except OSError as exc:
            self.abandon()
            raise RunDirError(f"could not move the finished run into {self.out}: {exc}") from exc
        self._state.done = True
        self._lock.release()
        return self.out

    def abandon(self) -> None:
        """Give up: ``out`` stays as it was; only checkpoint chunks are kept for --resume."""
        self._state.abandon()
