"""Reports: run directories -> ``report.html`` (self-contained) and ``report.md``.

For each figure and table of the paper the report sets the paper's statement
beside our numbers and says whether it holds. The checks live with the
experiments: a module in :mod:`mptlml.experiments` may define
``claims(results) -> list[dict]`` with keys ``claim`` (what is checked),
``paper`` (the paper's statement or number), ``ours`` (our number) and
``holds`` (bool, or None when it cannot be decided). The report is rebuilt
from run directories alone, so a long run and a later report are separate
steps; an incomplete run directory is listed as missing, not fatal.

The report sits above the experiments: it reads their registry
(:mod:`mptlml.experiments.registry`) and each module's ``TITLE``, ``PAPER``
and ``claims``; no experiment imports it.
"""

from __future__ import annotations

import base64
import html
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._io import atomic_write_text
from .experiments.common import environment, load_results
from .experiments.registry import EXPERIMENTS, get_experiment

__all__ = ["ERRATA", "PAPER_SECTIONS", "Report", "build_report", "collect_runs", "report_json"]

#: the paper's figures and tables, in reading order: experiment name -> (title, statement);
#: each experiment module holds its own (``TITLE``, ``PAPER``).
PAPER_SECTIONS: dict[str, tuple[str, str]] = {
    name: (get_experiment(name).TITLE, get_experiment(name).PAPER) for name in EXPERIMENTS
}

#: errata found in the paper's text (see shared/paper/NOTES.md).
ERRATA: list[str] = [
    "Eq. 7 and Appendix B give the Gaussian conditional variance as S_MM + S_MR^T S_RR^-1 "
    "S_MR; the correct variance has a minus sign (the authors' code uses the minus, and so do we).",
    "Eq. 7 drops the mean mu; the conditional mean is mu_M + S_MR^T S_RR^-1 (x_R - mu_R).",
    "The authors' synthetic PPCA data share one noise value across all D dimensions with "
    "standard deviation 1/beta, while the model's noise variance is 1/beta; we draw "
    "independent noise per dimension by default and offer theirs as an option.",
    "In the Bernoulli (linear VAE) experiment the paper's code scores the marginal log p(x_M) "
    "of the masked pixels, not the conditional log p(x_M | x_R); we use the true conditional "
    "(the marginal is an option).",
    "Table 1's true LML of -60.34 comes without the D, N or seed that produced it, so only its "
    "shrinking spread can be compared.",
]


@dataclass
class Report:
    """What a report shows: sections found, claims checked, parts missing."""

    sections: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def num_claims(self) -> int:
        return sum(len(s["claims"]) for s in self.sections)

    @property
    def num_holding(self) -> int:
        return sum(1 for s in self.sections for c in s["claims"] if c.get("holds") is True)


def collect_runs(paths: Sequence[str | Path]) -> tuple[dict[str, tuple[Path, dict]], list[str]]:
    """Find run directories (a path itself, or its immediate sub-directories).

    Returns ``({experiment: (dir, results)}, problems)``: a sub-directory
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
                f"{p} does not exist; pass the --out directory of `mptlml reproduce NAME`, "
                "`mptlml reproduce all`, `curve`, `select` or `demo`.")
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
            found[res.get("experiment", d.name)] = (d, res)
    return found, problems


def _claims_for(name: str, results: dict) -> list[dict[str, Any]]:
    if name not in EXPERIMENTS:
        return []
    mod = get_experiment(name)
    if not hasattr(mod, "claims"):
        return []
    try:
        return list(mod.claims(results["results"]))
    except Exception as exc:  # a broken claim check must not hide the rest of the report
        return [{"claim": "claim check failed", "paper": "", "ours": repr(exc), "holds": None}]


def build_report(paths: Sequence[str | Path], out: str | Path | None = None) -> Report:
    """Build ``report.html`` and ``report.md`` in ``out`` from run directories.

    Parameters
    ----------
    paths : run directories, or directories holding run sub-directories
        (``mptlml reproduce all`` writes one sub-directory per experiment).
    out : directory for the report files (default: the first path).
    """
    if not paths:
        raise ValueError("pass at least one run directory.")
    if not any(Path(p).exists() for p in paths):
        raise FileNotFoundError(
            f"none of the run directories exist: {', '.join(map(str, paths))}; pass the --out "
            "directory of `mptlml reproduce NAME` or `mptlml reproduce all`."
        )
    found, problems = collect_runs(paths)
    rep = Report(problems=problems)
    for name, (title, statement) in PAPER_SECTIONS.items():
        if name not in found:
            rep.missing.append(name)
            continue
        d, res = found[name]
        figures = sorted(d.glob("*.png"))
        rep.sections.append({
            "name": name, "title": title, "paper": statement, "dir": str(d),
            "claims": _claims_for(name, res), "figures": figures,
            "wall_time_s": res.get("wall_time_s"), "quick": res.get("results", {}).get("quick"),
            "seed": res.get("seed"), "environment": res.get("environment", {}),
            "notes": res.get("results", {}).get("notes"),
        })
    out_dir = Path(out) if out is not None else Path(paths[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "report.md", _markdown(rep, out_dir))
    atomic_write_text(out_dir / "report.html", _html(rep))
    atomic_write_text(out_dir / "report.json", report_json(rep) + "\n")
    return rep


def _holds(v: Any) -> str:
    return {True: "holds", False: "does not hold"}.get(v, "undecided")


def _env_rows(rep: Report) -> list[tuple[str, str]]:
    env = next((s["environment"] for s in rep.sections if s["environment"]), None) or environment()
    rows = [("python", str(env.get("python"))), ("platform", str(env.get("platform"))),
            ("CPU cores", str(env.get("cpu_count"))),
            ("torch threads", str(env.get("torch_threads"))),
            ("GPU", str(env.get("cuda") or "none"))]
    rows += [(k, str(v)) for k, v in (env.get("versions") or {}).items()]
    rows += [(f"wall time: {s['name']}", f"{s['wall_time_s']} s (seed {s['seed']}, "
              f"{'quick' if s['quick'] else 'full'} mode)") for s in rep.sections]
    return rows


def _markdown(rep: Report, out_dir: Path) -> str:
    lines = ["# mptlml: reproduction report",
             "",
             "*On Masked Pre-training and the Marginal Likelihood* (Moreno-Muñoz, Recasens, "
             "Hauberg, NeurIPS 2023), reproduced with mptlml. Generated "
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}.",
             "",
             f"{rep.num_holding} of {rep.num_claims} checked claims hold.",
             ""]
    for s in rep.sections:
        lines += [f"## {s['title']}", "", f"**Paper:** {s['paper']}", ""]
        if s["claims"]:
            lines += ["| check | paper | ours | verdict |", "|---|---|---|---|"]
            lines += [f"| {c.get('claim', '')} | {c.get('paper', '')} | {c.get('ours', '')} | "
                      f"{_holds(c.get('holds'))} |" for c in s["claims"]]
        else:
            lines.append("_No claim check is defined for this part; see its results.json._")
        if s.get("notes"):
            lines += ["", f"Note: {s['notes']}"]
        lines.append("")
        for f in s["figures"]:
            try:
                rel = Path(f).resolve().relative_to(out_dir.resolve())
            except ValueError:
                rel = Path(f).resolve()
            lines += [f"![{f.stem}]({rel})", ""]
    if rep.missing:
        lines += ["## Missing parts", ""]
        lines += [f"- `{m}`: no finished run directory (run `mptlml reproduce {m}`)"
                  for m in rep.missing]
        lines.append("")
    if rep.problems:
        lines += ["## Problems reading run directories", ""]
        lines += [f"- {p}" for p in rep.problems]
        lines.append("")
    lines += ["## Errata in the paper", ""] + [f"- {e}" for e in ERRATA] + [""]
    lines += ["## Environment", "", "| item | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in _env_rows(rep)]
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.holds{color:#17702b;font-weight:600}
.fails{color:#b00020;font-weight:600}.undecided{color:#996a00}img{max-width:100%;
border:1px solid #eee;margin:0.5em 0}.paper{background:#f7f7fb;padding:0.5em 0.8em;
border-left:3px solid #88a}
"""


def _html(rep: Report) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             "<title>mptlml reproduction report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>mptlml: reproduction report</h1>",
             "<p><em>On Masked Pre-training and the Marginal Likelihood</em> (Moreno-Muñoz, "
             "Recasens, Hauberg, NeurIPS 2023), reproduced with mptlml. Generated "
             f"{e(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>",
             f"<p id='summary'>{rep.num_holding} of {rep.num_claims} checked claims hold.</p>"]
    for s in rep.sections:
        parts.append(f"<section id='{e(s['name'])}'><h2>{e(s['title'])}</h2>")
        parts.append(f"<p class='paper'><b>Paper:</b> {e(s['paper'])}</p>")
        if s["claims"]:
            parts.append("<table><tr><th>check</th><th>paper</th><th>ours</th>"
                         "<th>verdict</th></tr>")
            for c in s["claims"]:
                h = c.get("holds")
                cls = {True: "holds", False: "fails"}.get(h, "undecided")
                parts.append(f"<tr><td>{e(str(c.get('claim', '')))}</td>"
                             f"<td>{e(str(c.get('paper', '')))}</td>"
                             f"<td>{e(str(c.get('ours', '')))}</td>"
                             f"<td class='{cls}'>{_holds(h)}</td></tr>")
            parts.append("</table>")
        else:
            parts.append("<p><em>No claim check is defined for this part.</em></p>")
        if s.get("notes"):
            parts.append(f"<p>Note: {e(str(s['notes']))}</p>")
        for f in s["figures"]:
            data = base64.b64encode(Path(f).read_bytes()).decode("ascii")
            parts.append(f"<figure><img alt='{e(f.stem)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{e(f.name)}</figcaption></figure>")
        parts.append("</section>")
    if rep.missing:
        parts.append("<section id='missing'><h2>Missing parts</h2><ul>")
        parts += [f"<li><code>{e(m)}</code>: no finished run directory (run "
                  f"<code>mptlml reproduce {e(m)}</code>)</li>" for m in rep.missing]
        parts.append("</ul></section>")
    if rep.problems:
        parts.append("<section id='problems'><h2>Problems reading run directories</h2><ul>")
        parts += [f"<li>{e(p)}</li>" for p in rep.problems]
        parts.append("</ul></section>")
    parts.append("<section id='errata'><h2>Errata in the paper</h2><ul>")
    parts += [f"<li>{e(x)}</li>" for x in ERRATA]
    parts.append("</ul></section><section id='environment'><h2>Environment</h2><table>")
    parts += [f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in _env_rows(rep)]
    parts.append("</table></section></body></html>")
    return "\n".join(parts) + "\n"


def report_json(rep: Report) -> str:
    """A machine-readable summary of the report."""
    return json.dumps({
        "claims": [{"section": s["name"], **c} for s in rep.sections for c in s["claims"]],
        "missing": rep.missing, "problems": rep.problems,
    }, indent=2, default=str)
