"""Reports: run directories -> ``report.html`` (self-contained), ``report.md`` and ``report.json``.

For each figure and table of the paper the report sets the paper's statement
beside our numbers and says exactly what was checked: every claim has a
status, one of ``holds``, ``fails``, ``undecided`` (the run is too small to
decide it: quick sizes, with the full-size outcome beside it, or a test within
its noise), ``recomputed`` (re-derived from the authors' published data,
nothing re-run) and ``not run`` (see :mod:`mptlml.reproduce.claims`). The
checks live with the parts: each :class:`~mptlml.reproduce.parts.Part` has

- ``title`` and ``paper``: the section's heading and the paper's statement;
- ``claims(results) -> list[dict]`` (built with
  :func:`mptlml.reproduce.claims.claim`: ``claim``, ``paper``, ``ours``,
  ``holds``, ``status`` and an optional ``note``);
- optionally ``captions(config, results) -> {figure stem: caption}``: what
  each figure plots, its setting and the paper's figure it corresponds to;
- optionally ``tables(results) -> list[dict]``: extra tables (``title``,
  ``rows``, ``caption``), e.g. Table 1 under both set-ups.

The top of the report states the mode (quick or full, with the run's sizes
against the full ones, which follow the paper), the count of claims per status
and every failing claim with a link to its section. The report is rebuilt from
run directories alone, so a long run and a later report are separate steps; an
incomplete run directory is listed as missing, not fatal. HTML and Markdown
come from the jinja2 templates in ``mptlml/templates``; the HTML embeds its
figures, so it is one self-contained file. The paper's errata come from the
packaged ``mptlml/data/errata.md`` (:func:`errata`), the one text of them.

The report sits above the parts: it reads their registry
(:data:`mptlml.reproduce.parts.PARTS`); no part imports it.
"""

from __future__ import annotations

import base64
import html
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from ._io import atomic_write_text, jsonable
from ._markdown import md_cell
from ._optional import require
from .reproduce.claims import STATUSES, status_of
from .reproduce.parts import PARTS, get_part
from .runs.config import execution_settings
from .runs.rundir import environment, load_results

__all__ = ["ERRATA", "STATUSES", "Report", "build_report", "collect_runs", "default_out",
           "errata", "report_json"]

def errata() -> list[str]:
    """The errata of the paper's text, one Markdown string per erratum.

    Read from the packaged ``mptlml/data/errata.md`` (a numbered list), the one
    text of them: the documentation's notes page holds the same text.
    """
    text = files("mptlml.data").joinpath("errata.md").read_text(encoding="utf-8")
    items: list[list[str]] = []
    for line in text.splitlines():
        m = re.match(r"\d+\.\s+(.*)", line)
        if m:
            items.append([m.group(1)])
        elif line.strip():
            items[-1].append(line.strip())
    return [" ".join(item) for item in items]


#: the errata of the paper's text (:func:`errata`), as the report lists them.
ERRATA: list[str] = errata()


@dataclass
class Report:
    """What a report shows: sections found, claims checked, parts missing."""

    sections: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: the directory the report files were written to
    out: Path | None = None

    @property
    def claims(self) -> list[dict[str, Any]]:
        """Every claim of every section, in reading order."""
        return [c for s in self.sections for c in s["claims"]]

    @property
    def num_claims(self) -> int:
        return len(self.claims)

    @property
    def num_holding(self) -> int:
        """Claims that hold in our own runs (status ``holds``; recomputed ones not counted)."""
        return self.counts["holds"]

    @property
    def counts(self) -> dict[str, int]:
        """Number of claims per status, every status present (zero when none)."""
        out = dict.fromkeys(STATUSES, 0)
        for c in self.claims:
            out[c["status"]] += 1
        return out

    @property
    def failing(self) -> list[dict[str, Any]]:
        """The failing claims, each with its section's name and title."""
        return [{**c, "section": s["name"], "section_title": s["title"]}
                for s in self.sections for c in s["claims"] if c["status"] == "fails"]

    @property
    def mode(self) -> str:
        """``quick``, ``full``, ``mixed`` (parts in both modes) or ``unknown``."""
        modes = {s["quick"] for s in self.sections if s["quick"] is not None}
        if not modes:
            return "unknown"
        return "mixed" if len(modes) > 1 else ("quick" if modes.pop() else "full")

    @property
    def environment(self) -> dict[str, Any] | None:
        """The machine and versions the parts recorded (the first part that has them)."""
        return next((s["environment"] for s in self.sections if s["environment"]), None)

    def summary_line(self) -> str:
        """``"20 hold, 2 fail, 3 undecided, 12 recomputed, 1 not run (38 claims, quick mode)"``."""
        c = self.counts
        return (f"{c['holds']} hold, {c['fails']} fail, {c['undecided']} undecided, "
                f"{c['recomputed']} recomputed, {c['not run']} not run ({self.num_claims} "
                f"claims, {self.mode} mode)")


def collect_runs(paths: Sequence[str | Path]) -> tuple[dict[str, tuple[Path, dict]], list[str]]:
    """Find run directories (a path itself, or its immediate sub-directories).

    Returns ``({part: (dir, results)}, problems)``: a sub-directory
    without a readable results.json, or with an unknown format, becomes a
    problem line, and so does a part of a ``reproduce all`` directory whose
    latest run failed (``NAME.error.txt`` newer than its results.json: the
    results left there are from an earlier run and are not reported). Hidden
    entries (staging directories of runs in progress) are skipped.

    Raises
    ------
    ValueError
        If a path is a file, or holds neither a results.json nor any run
        sub-directory (nor a ``reproduce all`` status.json).
    FileNotFoundError
        If a path does not exist.
    """
    found: dict[str, tuple[Path, dict]] = {}
    problems: list[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise FileNotFoundError(
                f"{p} does not exist; pass the --out directory of `mptlml reproduce NAME` or "
                "`mptlml reproduce all`.")
        if not p.is_dir():
            raise ValueError(f"{p} is a file, not a run directory; pass the --out directory of "
                             "`mptlml reproduce NAME` or `mptlml reproduce all`.")
        if (p / "results.json").exists():
            candidates = [p]
        else:
            candidates = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
            if not (p / "status.json").exists() and not any(
                    (d / "results.json").exists() or (p / f"{d.name}.error.txt").exists()
                    for d in candidates):
                raise ValueError(
                    f"{p} is not a run directory: it holds no results.json and no run "
                    "sub-directories. Pass the --out directory of a finished run.")
        for d in candidates:
            error_file = d.parent / f"{d.name}.error.txt"
            results_file = d / "results.json"
            if d != p and error_file.is_file() and (
                    not results_file.is_file()
                    or error_file.stat().st_mtime_ns >= results_file.stat().st_mtime_ns):
                problems.append(f"{d.name}: its latest run failed (see {error_file}); "
                                "results left from an earlier run are not reported")
                continue
            try:
                res = load_results(d)
            except (FileNotFoundError, ValueError) as exc:
                problems.append(str(exc))
                continue
            kind = res.get("experiment")
            if kind not in PARTS:
                problems.append(_not_a_reproduction(d, kind))
                continue
            hollow = _hollow(res)
            if hollow:
                problems.append(f"{d / 'results.json'} {hollow}: the run did not record its "
                                f"numbers, so its claims cannot be checked; run `mptlml "
                                f"reproduce {kind}` again into {d}")
                continue
            found[kind] = (d, res)
    return found, problems


def _hollow(res: dict[str, Any]) -> str:
    """What a part's results.json lacks that every finished part records (``""``: nothing)."""
    results = res.get("results")
    if not isinstance(results, dict) or not results:
        return "holds no results"
    if not isinstance(results.get("quick"), bool):
        return "records no mode (quick or full)"
    if not isinstance(res.get("config"), dict):
        return "records no settings"
    return ""


def default_out(path: str | Path) -> Path:
    """Where a report goes by default: a ``reproduce all`` directory itself; beside one run.

    A single part's run directory is replaced as a whole by its next run, so
    its report goes to ``RUN_DIR-report`` beside it, not into it.
    """
    p = Path(path)
    return p.parent / f"{p.name}-report" if (p / "results.json").is_file() else p


def _not_a_reproduction(d: Path, kind: Any) -> str:
    """Why a finished run directory is not part of the report (a demo, curve or select run)."""
    return (f"{d} is a `mptlml {kind}` run, not a part of the paper: the report covers the "
            "paper's reproductions; pass the --out directory of `mptlml reproduce NAME` or `mptlml "
            "reproduce all` (this run's results are its results.json, CSVs and figures)")


def _claims_for(name: str, results: dict) -> list[dict[str, Any]]:
    """The section's claims, each with a checked ``status`` and an ``anchor``."""
    try:
        raw = list(get_part(name).claims(results["results"]))
        claims = [{**c, "status": status_of(c)} for c in raw]
    except Exception as exc:  # a broken claim check must not hide the rest of the report
        claims = [{"claim": "claim check failed", "paper": "", "ours": repr(exc),
                   "holds": False, "status": "fails",
                   "note": "the part's claims() raised: a bug in the check; see the error"}]
    for i, c in enumerate(claims):
        c["anchor"] = f"{name}-claim-{i + 1}"
    return claims


def _captions(name: str, res: dict) -> dict[str, str]:
    captions = get_part(name).captions
    if captions is None:
        return {}
    try:
        return dict(captions(res.get("config") or {}, res.get("results") or {}))
    except Exception:  # a caption is never worth losing the report
        return {}


def _tables(name: str, res: dict) -> list[dict[str, Any]]:
    tables = get_part(name).tables
    if tables is None:
        return []
    try:
        out = []
        for t in tables(res.get("results") or {}):
            rows = [{str(k): "" if v is None else str(v) for k, v in r.items()}
                    for r in t.get("rows", [])]
            cols = list(dict.fromkeys(k for r in rows for k in r))
            out.append({"title": t.get("title", ""), "caption": t.get("caption", ""),
                        "columns": cols, "rows": rows})
        return out
    except Exception:
        return []


def _fmt_value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(_fmt_value(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _sizes(name: str, config: dict) -> list[dict[str, str]]:
    """The run's settings that differ from the full mode's (the paper's where it states them).

    Execution-only settings (:func:`~mptlml.runs.config.execution_settings`:
    threads, workers, ...) change no number, so they are no size.
    """
    if not isinstance(config, dict):
        return []
    cls = get_part(name).config
    try:
        full = jsonable(cls())
    except Exception:
        return []
    skip = execution_settings(cls)
    return [{"key": k, "ours": _fmt_value(v), "full": _fmt_value(full[k])}
            for k, v in config.items()
            if k in full and k not in skip and jsonable(v) != full[k]]


def _unsafe_figure(f: Path, run_dir: Path) -> str:
    """Why ``f`` must not go into the report (``""``: it may): a link out of ``run_dir``, no PNG.

    The HTML embeds every figure, so a ``*.png`` symlink to any file (a key, a
    password file) would copy that file into report.html.
    """
    try:
        target = f.resolve(strict=True)
    except (OSError, RuntimeError):
        return "a broken symbolic link"
    if not target.is_relative_to(run_dir.resolve()):
        return (f"a symbolic link to {target}, outside the run directory; copy the figure "
                "into the run directory instead")
    if not target.is_file():
        return "not a file"
    with open(target, "rb") as fh:
        if fh.read(8) != b"\x89PNG\r\n\x1a\n":
            return "not a PNG image (its first bytes are not the PNG signature)"
    return ""


def build_report(paths: Sequence[str | Path], out: str | Path | None = None) -> Report:
    """Build ``report.html``, ``report.md`` and ``report.json`` in ``out`` from run directories.

    Parameters
    ----------
    paths : run directories, or directories holding run sub-directories
        (``mptlml reproduce all`` writes one sub-directory per part).
    out : directory for the report files (default :func:`default_out` of the
        first path: a ``reproduce all`` directory itself, ``RUN_DIR-report``
        beside a single run).
    """
    if not paths:
        raise ValueError("pass at least one run directory.")
    if not any(Path(p).exists() for p in paths):
        raise FileNotFoundError(
            f"none of the run directories exist: {', '.join(map(str, paths))}; pass the --out "
            "directory of `mptlml reproduce NAME` or `mptlml reproduce all`."
        )
    found, problems = collect_runs(paths)
    if not found and problems and all("the report covers the paper's reproductions" in p
                                      for p in problems):
        raise ValueError(problems[0] + ".")
    rep = Report(problems=problems)
    for name in PARTS:  # the paper's reading order
        if name not in found:
            rep.missing.append(name)
            continue
        d, res = found[name]
        part = get_part(name)
        captions = _captions(name, res)
        order = {stem: i for i, stem in enumerate(captions)}  # the part's figure order
        pngs = sorted(d.glob("*.png"), key=lambda f: (order.get(f.stem, len(order)), f.name))
        figures = []
        for f in pngs:
            why = _unsafe_figure(f, d)
            if why:
                rep.problems.append(f"{f}: not embedded: {why}")
                continue
            figures.append({"path": f, "stem": f.stem, "caption": captions.get(f.stem, f.name)})
        rep.sections.append({
            "name": name, "title": part.title, "paper": part.paper, "dir": str(d),
            "claims": _claims_for(name, res), "figures": figures,
            "tables": _tables(name, res), "sizes": _sizes(name, res.get("config")),
            "wall_time_s": res.get("wall_time_s"), "quick": res.get("results", {}).get("quick"),
            "seed": res.get("seed"), "environment": res.get("environment", {}),
            "notes": res.get("results", {}).get("notes"),
        })
    out_dir = Path(out) if out is not None else default_out(paths[0])
    rep.out = out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "report.md", _render(rep, "report.md.jinja", out_dir))
    atomic_write_text(out_dir / "report.html", _render(rep, "report.html.jinja", out_dir))
    atomic_write_text(out_dir / "report.json", report_json(rep) + "\n")
    return rep


def _env_rows(rep: Report) -> list[tuple[str, str]]:
    env = rep.environment or environment()
    rows = [("python", str(env.get("python"))), ("platform", str(env.get("platform"))),
            ("CPU cores", str(env.get("cpu_count"))),
            ("torch threads", str(env.get("torch_threads"))),
            ("GPU", str(env.get("gpu") or "none"))]
    shown = {"python", "platform", "cpu_count", "torch_threads", "gpu", "versions", "machine"}
    rows += [(k, str(v)) for k, v in env.items() if k not in shown and v is not None
             and not isinstance(v, dict | list)]  # e.g. a CPU model or git commit, when recorded
    rows += [(k, str(v)) for k, v in (env.get("versions") or {}).items()]
    rows += [(f"wall time: {s['name']}", f"{s['wall_time_s']} s (seed {s['seed']}, "
              f"{'quick' if s['quick'] else 'full'} mode)") for s in rep.sections]
    return rows


def _md_inline_html(text: str) -> str:
    """A line of Markdown (``**bold**``, ``*emphasis*``, ``` `code` ```) as escaped HTML."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    out = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", out)
    return out


_BADGES_MD = {"holds": "✅ holds", "fails": "❌ fails", "undecided": "🟡 undecided",
              "recomputed": "🔁 recomputed", "not run": "⚪ not run"}


def _md_link(path: str) -> str:
    """A relative file path as a Markdown link target (percent-encoded)."""
    from urllib.parse import quote

    return quote(path)


def _render(rep: Report, template: str, out_dir: Path) -> str:
    require("jinja2", "a report (report.html, report.md)")
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("mptlml", "templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.jinja",),
                                            default_for_string=False),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined)
    env.filters["md"] = md_cell
    env.filters["md_html"] = _md_inline_html
    env.filters["md_link"] = _md_link
    env.filters["badge_md"] = lambda s: _BADGES_MD[s]
    env.filters["slug"] = lambda s: s.replace(" ", "-")

    def embed(path: Path) -> str:
        return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")

    def relpath(path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(out_dir.resolve()))
        except ValueError:
            return str(Path(path).resolve())

    env.filters["embed"] = embed
    env.filters["relpath"] = relpath
    return env.get_template(template).render(
        rep=rep, generated=time.strftime("%Y-%m-%d %H:%M:%S"), statuses=STATUSES,
        counts=rep.counts, failing=rep.failing, mode=rep.mode, errata=ERRATA,
        environment=_env_rows(rep),
        sized=[s for s in rep.sections if s["sizes"]])


def report_json(rep: Report) -> str:
    """A machine-readable summary of the report: every claim with its status, the counts,
    each part's wall time and the machine it ran on."""
    return json.dumps({
        "mode": rep.mode,
        "counts": rep.counts,
        "claims": [{"section": s["name"], **{k: v for k, v in c.items() if k != "anchor"}}
                   for s in rep.sections for c in s["claims"]],
        "failing": [{"section": c["section"], "claim": c["claim"]} for c in rep.failing],
        "sizes": {s["name"]: s["sizes"] for s in rep.sections if s["sizes"]},
        "parts": [{"name": s["name"], "title": s["title"], "wall_time_s": s["wall_time_s"],
                   "quick": s["quick"], "git_commit": s["environment"].get("git_commit"),
                   "torch_threads": s["environment"].get("torch_threads")}
                  for s in rep.sections],
        "environment": {k: v for k, v in (rep.environment or {}).items()
                        if k in ("cpu", "cpu_count", "platform", "python", "gpu", "versions")},
        "missing": rep.missing, "problems": rep.problems,
    }, indent=2, default=str)
