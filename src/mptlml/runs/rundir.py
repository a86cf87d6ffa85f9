"""Run directories: one finished run or the previous one, written as a transaction.

Every job (a reproduction of the paper, ``mptlml demo``, ``curve``, ``select``)
writes into one run directory, :class:`RunDir`:

- ``results.json``: format version, the job's name, config, seed, package
  versions, hardware, wall time, the files the run wrote (``checkpoint/``
  among them when it kept checkpoint chunks) and the job's own numbers
  (:func:`load_results` reads it back, checking the format);
- one CSV per plotted series;
- each figure as PNG and PDF.

Each file is written atomically (:mod:`mptlml._io`). A run never writes into
its ``--out`` directory ``OUT`` directly (:class:`Transaction`). While it
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
import csv
import ctypes
import ctypes.util
import io
import json
import logging
import os
import platform
import shutil
import sys
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._io import atomic_write_bytes, atomic_write_text, jsonable
from .._optional import require

_log = logging.getLogger(__name__)

__all__ = ["RESULTS_FORMAT", "RunDir", "RunDirError", "Transaction", "environment", "load_results",
           "lock_path", "locked", "resolve_out", "staging_path"]

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


#: version of the results.json layout; ``mptlml report`` refuses newer ones.
RESULTS_FORMAT = 1


def environment() -> dict[str, Any]:
    """Package versions, hardware, the command line and the git commit, for results.json."""
    import importlib.metadata as md

    versions = {}
    for pkg in ("mptlml", "torch", "numpy", "scikit-learn", "transformers", "datasets",
                "accelerate", "matplotlib", "pandas"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    cpu = platform.processor() or None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f
                        if ln.lower().startswith("model name")), cpu)
    except OSError:
        pass
    commit, dirty = _git_state()
    env: dict[str, Any] = {
        "command": list(sys.argv),
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "versions": versions,
    }
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:  # pragma: no cover
        pass
    return env


def _git_state() -> tuple[str | None, bool | None]:
    """HEAD of the git checkout the package runs from and whether it has local changes.

    ``(None, None)`` for an installed package (its files are not tracked by a
    repository around it), without git, or when git does not answer within 5 s.
    """
    import subprocess

    pkg = Path(__file__).resolve().parent.parent

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=pkg, capture_output=True, text=True,
                              timeout=5, check=False)

    try:
        if git("ls-files", "--error-unmatch", "__init__.py").returncode != 0:
            return None, None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        return head.stdout.strip(), git("diff", "--quiet", "HEAD", "--", ".").returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None, None


def load_results(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read a run directory's ``results.json``, checking its format version.

    Raises
    ------
    FileNotFoundError
        If the directory or its results.json is missing.
    ValueError
        If the file is corrupt or written by a newer, unknown format.
    """
    d = Path(run_dir)
    path = d / "results.json"
    if d.exists() and not d.is_dir():
        raise ValueError(f"{run_dir} is a file, not a run directory; pass the --out directory "
                         "of an mptlml command (`mptlml reproduce NAME`, `mptlml curve`, ...).")
    if not d.is_dir():
        hint = ""
        if (d.parent / f".{d.name}.old").exists():
            hint = (" A process was killed while replacing it; the next run with this --out "
                    "repairs it.")
        raise FileNotFoundError(f"run directory {run_dir} does not exist.{hint}")
    if not path.is_file():
        raise FileNotFoundError(
            f"{run_dir} has no results.json: the run did not finish, or this is not a run "
            "directory. Run the job again (it resumes where supported)."
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); run the job again.") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a results object; "
                         "it was not written by mptlml. Run the job again.")
    fmt = data.get("format")
    if not isinstance(fmt, int) or fmt > RESULTS_FORMAT:
        raise ValueError(
            f"{path} has results format {fmt!r}, but this mptlml reads format <= {RESULTS_FORMAT}; "
            "upgrade mptlml or run the job again with this version."
        )
    return data


class RunDir:
    """A run directory for one job, written as a transaction (:class:`Transaction`).

    Files are written into a hidden staging directory beside ``path``;
    :meth:`write_results` writes
    ``results.json`` last and then swaps the staging directory in, so ``path``
    only ever holds a finished run. While it runs, the run holds a lock that
    refuses a second process targeting the same ``path``. Use it as a context
    manager so that a failure releases the lock and drops the staging
    directory at once (otherwise that happens when the object is collected,
    or at exit)::

        with RunDir(out, "name", overwrite=True) as run:
            run.write_csv(...)
            run.write_results(config, results)

    Parameters
    ----------
    path : path-like
        The run directory. If it exists and is not empty it is refused,
        unless ``overwrite`` (it is replaced when the new run succeeds) or
        ``resume`` (finished checkpoint chunks are reused).
    name : str
        The job's name (a part of the paper, ``demo``, ``curve``, ``select``),
        stored in results.json as ``experiment``.
    worker : bool
        A non-main process of a data-parallel run (see :class:`Transaction`).

    Attributes
    ----------
    path : pathlib.Path
        Where files go: the staging directory while the run is going, the
        final directory once it is committed.
    final : pathlib.Path
        The run directory asked for.
    """

    def __init__(self, path: str | os.PathLike, name: str, *, overwrite: bool = False,
                 resume: bool = False, worker: bool = False) -> None:
        self.final = Path(path)
        self.name = name
        self._tx = Transaction(path, overwrite=overwrite, resume=resume, worker=worker)
        self.path = self._tx.staging
        self._t0 = time.perf_counter()
        self.files: list[str] = []

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._tx.active:  # failed, interrupted, or left without write_results
            self._tx.abandon()

    def abandon(self) -> None:
        """Give up the run: the previous run directory stays as it was."""
        self._tx.abandon()

    def file(self, name: str) -> Path:
        """Path of a file inside the run directory."""
        return self.path / name

    def write_json(self, name: str, data: Any) -> Path:
        """Atomically write JSON (tensors, arrays and NaN handled)."""
        p = self.file(name)
        atomic_write_text(p, json.dumps(jsonable(data), indent=2, sort_keys=False) + "\n")
        self._track(name)
        return p

    def write_csv(self, name: str, rows: Iterable[Mapping[str, Any]],
                  columns: Sequence[str] | None = None) -> Path:
        """Atomically write a CSV from a list of dict rows (missing, None and NaN cells empty).

        The standard library's ``csv`` (minimal quoting, Unix line ends): a run's CSVs need
        no extra.
        """
        rows = [jsonable(r) for r in rows]
        cols = list(columns) if columns is not None else (list(rows[0].keys()) if rows else [])
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(cols)
        writer.writerows([r.get(c) for c in cols] for r in rows)
        p = self.file(name)
        atomic_write_text(p, buf.getvalue())
        self._track(name)
        return p

    def save_figure(self, fig: Any, stem: str,
                    formats: Sequence[str] = ("png", "pdf")) -> list[Path]:
        """Save a matplotlib figure as PNG and PDF (atomically) and close it."""
        require("matplotlib", "a run's figures")
        import matplotlib.pyplot as plt

        out = []
        for fmt in formats:
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=130, bbox_inches="tight")
            p = self.file(f"{stem}.{fmt}")
            atomic_write_bytes(p, buf.getvalue())
            self._track(p.name)
            out.append(p)
        plt.close(fig)
        return out

    def write_results(self, config: Any, results: Mapping[str, Any], *,
                      seed: int | None = None) -> Path:
        """Write ``results.json`` last and swap the run in; return its final path."""
        data = {
            "format": RESULTS_FORMAT,
            "experiment": self.name,
            "config": jsonable(config),
            "seed": seed,
            "wall_time_s": round(time.perf_counter() - self._t0, 3),
            "environment": environment(),
            "files": sorted({*self.files, *self._checkpoints()}),
            "results": jsonable(results),
        }
        self.write_json("results.json", data)
        self._tx.commit()
        self.path = self.final
        return self.path / "results.json"

    def _checkpoints(self) -> list[str]:
        """``["checkpoint/"]`` when the run kept checkpoint chunks (reused by ``--resume``)."""
        return [f"{CHECKPOINT_DIR}/"] if (self.path / CHECKPOINT_DIR).is_dir() else []

    def _track(self, name: str) -> None:
        if name != "results.json":
            self.files.append(name)
