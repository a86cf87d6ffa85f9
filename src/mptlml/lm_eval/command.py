"""``python -m mptlml.lm_eval``: lm-eval's own command line, with the ``mptlml`` model registered.

Every argument is lm-eval's (``--model``, ``--model_args``, ``--tasks``,
``--include_path``, ``--output_path``, ``--log_samples``, ``--limit``, ...); the
model ``mptlml`` is registered before lm-eval parses them. For the run, three of
lm-eval's functions are wrapped (and put back after):

- ``simple_evaluate``: its results get each metric's Monte Carlo standard error
  beside lm-eval's own (:func:`~mptlml.lm_eval.records.add_monte_carlo_stderr`:
  ``acc_mc_stderr,none``, ``word_perplexity_mc_stderr,none``, ...), so they are in
  the saved results file;
- ``make_table``: the printed table shows them, one row each;
- ``EvaluationTracker.save_results_aggregated``: the run's per-request records go
  beside lm-eval's ``results_<timestamp>.json``, as
  ``mptlml_monte_carlo_<the same timestamp>.jsonl`` (a new file per run, never
  overwritten), unless ``--model_args mc_log=PATH`` says where; without
  ``--output_path`` lm-eval saves nothing and neither does mptlml.

Under ``accelerate launch -m mptlml.lm_eval ...`` every process runs this, and
the process group is closed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from .._optional import require
from .._scoring.distributed import shutdown_distributed
from .._validation import check_device
from .backend import BESIDE_RESULTS, MPTLM
from .generation import GENERATION_ARGUMENTS
from .peers import MODEL_DEFAULTS, PEER_ARGUMENTS
from .records import RecordLog, add_monte_carlo_stderr
from .settings import LOADING, SETTINGS, check_arg_names

logger = logging.getLogger("lm_eval.mptlml")

__all__ = ["HELP", "check_device_flag", "check_model_args_flag", "main", "output_dir", "run",
           "table_with_monte_carlo"]


def _names(names: tuple[str, ...]) -> str:
    return textwrap.fill(", ".join(names), width=88, initial_indent="  ",
                         subsequent_indent="  ")


#: printed before lm-eval's own help (``mptlml eval --help``)
HELP = f"""mptlml eval: lm-evaluation-harness with the model 'mptlml' registered.

Every argument is lm-eval's; the model is `--model mptlml`, configured by --model_args:
  pretrained=DIR_OR_ID: a masked LM, or a masked-diffusion LM with mask_token_id=ID
the Monte Carlo estimate (mptlml.compare's; decide=true: multiple choice stopped once
decided; target_se=NATS: a precision):
{_names(SETTINGS)}
loading (MaskedLM.from_pretrained) and placement:
{_names(("device", *LOADING))}
LLaDA's (eval_llada.py) and Dream's (eval/eval.py) arguments, with their meaning
(mc_num=N: N masks per request); their model names
--model llada_dist and --model dream run mptlml with their adapters' defaults:
{_names(PEER_ARGUMENTS)}
generate_until by LLaDA's sampler (mptlml.generate), LLaDA's or Dream's names:
{_names(tuple(GENERATION_ARGUMENTS))}

Example:
  mptlml eval --model mptlml --model_args pretrained=DIR,decide=true \\
      --tasks TASK --include_path TASKS_DIR --output_path OUT
(lm-eval's `run` is implied: `mptlml eval run --model ...` is the same).

The results (file and table) hold each metric's Monte Carlo standard error beside
lm-eval's (acc_mc_stderr, word_perplexity_mc_stderr, ...); each request's record goes
beside OUT/<model>/results_<timestamp>.json as mptlml_monte_carlo_<timestamp>.jsonl.
lm-eval's own help follows.
"""


def output_dir(argv: list[str]) -> Path | None:
    """The directory of lm-eval's ``--output_path`` (``-o``) in ``argv``, if any.

    lm-eval takes a directory, or a ``.json`` file whose directory it writes into.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--output_path", "-o", default=None)
    known, _ = parser.parse_known_args(argv)
    if not known.output_path:
        return None
    p = Path(known.output_path)
    return p.parent if p.suffix == ".json" else p


def check_device_flag(argv: list[str]) -> None:
    """A ``--device`` given on the command line must exist here (before any work).

    lm-eval's own default (``cuda:0``, not given) falls back to the CPU where CUDA
    is not available; a device the user asked for is an error instead, naming it.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--device", default=None)
    known, _ = parser.parse_known_args(argv)
    if known.device is not None:
        try:
            check_device(known.device)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"--device {known.device}: {exc} Pass --device cpu, or leave it "
                             "out (then a GPU when there is one, else the CPU).") from None


def check_model_args_flag(argv: list[str]) -> None:
    """``--model mptlml``'s ``--model_args k=v,...`` names, checked before lm-eval's work.

    lm-eval builds the model only after importing its command line and indexing every
    task (tens of seconds); a name :class:`~mptlml.lm_eval.MPTLM` does not take is
    refused here instead (:func:`~mptlml.lm_eval.settings.check_arg_names`), as the model
    would refuse it. The long options are read (``--model``, ``--model_args``: one
    ``k=v,...`` string, or several as lm-eval 0.4.9+ takes them); another model's
    arguments, and the JSON form, are left to lm-eval.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model", default=None)
    parser.add_argument("--model_args", nargs="+", default=None)
    known, _ = parser.parse_known_args(argv)
    if (known.model not in ("mptlml", *MODEL_DEFAULTS) or not known.model_args
            or known.model_args[0][:1] == "{"):
        return
    require("lm_eval", "mptlml eval (the lm-evaluation-harness command line)")
    from lm_eval.utils import simple_parse_args_string

    check_arg_names(simple_parse_args_string(",".join(known.model_args)))


def table_with_monte_carlo(result_dict: dict[str, Any], column: str = "results"
                           ) -> dict[str, Any]:
    """A copy of lm-eval's results whose ``METRIC_mc_stderr`` keys print as rows.

    lm-eval's ``make_table`` skips every metric named ``*_stderr`` (it reads them as
    the ``Stderr`` column of their metric); the copy's keys end in a space instead,
    so each Monte Carlo standard error shows as its own row, under its own name.
    """
    out = copy.copy(result_dict)
    out[column] = {task: {(f"{k.partition(',')[0]} ,{k.partition(',')[2]}"
                           if k.partition(",")[0].endswith("_mc_stderr") else k): v
                          for k, v in metrics.items()}
                   for task, metrics in result_dict.get(column, {}).items()}
    return out


def _folder(tracker: Any) -> Path:
    """The folder lm-eval writes its results file into (its save_results_aggregated's rule)."""
    path = Path(tracker.output_path)
    if path.suffix == ".json":
        return path.parent
    return path / str(tracker.general_config_tracker.model_name_sanitized)


def _results_folder(tracker: Any, date_id: str, expected: Path) -> Path:
    """Where lm-eval did write ``*_<date_id>.json`` (``expected`` when it is there; lm-eval
    versions differ in their folders), found under its ``--output_path``."""
    if any(expected.glob(f"*_{date_id}.json")):
        return expected
    root = Path(tracker.output_path)
    root = root.parent if root.suffix == ".json" else root
    found = sorted(root.rglob(f"*_{date_id}.json")) if root.is_dir() else []
    return found[0].parent if found else expected


@contextlib.contextmanager
def _harness_wrapped() -> Iterator[None]:
    """lm-eval's simple_evaluate, make_table and save_results_aggregated wrapped for the run."""
    require("lm_eval", "mptlml eval (the lm-evaluation-harness command line)")
    import lm_eval
    import lm_eval.evaluator
    import lm_eval.utils
    from lm_eval.loggers import evaluation_tracker as tracker_module

    evaluate = lm_eval.evaluator.simple_evaluate
    table = lm_eval.utils.make_table
    save = tracker_module.EvaluationTracker.save_results_aggregated
    clock = getattr(tracker_module, "datetime", None)
    top = lm_eval.__dict__.get("simple_evaluate")

    def simple_evaluate(*args: Any, **kwargs: Any) -> Any:
        results = evaluate(*args, **kwargs)
        if not isinstance(results, dict):
            return results  # another process's: the main one reports
        model = MPTLM.last() if MPTLM.last is not None else None
        return add_monte_carlo_stderr(results, model=model)

    def make_table(result_dict: dict[str, Any], column: str = "results", *args: Any,
                   **kwargs: Any) -> str:
        return table(table_with_monte_carlo(result_dict, column), column, *args, **kwargs)

    def save_results_aggregated(self: Any, results: dict[str, Any], *args: Any,
                                **kwargs: Any) -> Any:
        config = (results.get("config") or {}).get("mptlml") or {}
        run, MPTLM.pending_run = MPTLM.pending_run, None
        if not self.output_path or run is None or config.get("mc_log") != BESIDE_RESULTS:
            return save(self, results, *args, **kwargs)
        # lm-eval names its file by datetime.now() inside this call: that instant is fixed
        # here, so the records' file (and the results' config) carry the same timestamp
        now = datetime.now()
        stamp = now.isoformat().replace(":", "-")
        folder = _folder(self)
        config["mc_log"] = str(folder / f"mptlml_monte_carlo_{stamp}.jsonl")

        class _Now(datetime):
            @classmethod
            def now(cls, tz: Any = None) -> datetime:  # noqa: ARG003
                return now

        if clock is datetime:
            tracker_module.datetime = _Now
        try:
            out = save(self, results, *args, **kwargs)
        finally:
            if clock is not None:
                tracker_module.datetime = clock
        date_id = getattr(self, "date_id", stamp)
        path = _results_folder(self, date_id, folder) / f"mptlml_monte_carlo_{date_id}.jsonl"
        if str(path) != config["mc_log"]:
            logger.warning("lm-eval saved its results elsewhere than expected: the Monte Carlo "
                           "records are at %s (not %s, the results' config).", path,
                           config["mc_log"])
        RecordLog.dump(path, *run)
        logger.info("Monte Carlo records of every request: %s", path)
        return out

    # the names wherever lm-eval's command line may have bound them (its versions differ:
    # 0.4.8's __main__ imports make_table at the top, later ones inside the command)
    cli = [sys.modules[m] for m in ("lm_eval.__main__", "lm_eval._cli.run") if m in sys.modules]
    patches = [(m, "simple_evaluate", simple_evaluate) for m in (lm_eval.evaluator, *cli)
               if hasattr(m, "simple_evaluate")]
    patches += [(m, "make_table", make_table) for m in (lm_eval.utils, *cli)
                if hasattr(m, "make_table")]
    saved = [(m, name, getattr(m, name)) for m, name, _ in patches]
    for m, name, new in patches:
        setattr(m, name, new)
    lm_eval.simple_evaluate = simple_evaluate
    tracker_module.EvaluationTracker.save_results_aggregated = save_results_aggregated
    MPTLM.hold_last = True
    try:
        yield
    finally:
        MPTLM.hold_last, MPTLM.last = False, None
        for m, name, old in saved:
            setattr(m, name, old)
        if top is None:
            del lm_eval.simple_evaluate
        else:
            lm_eval.simple_evaluate = top
        tracker_module.EvaluationTracker.save_results_aggregated = save
        MPTLM.pending_run = None


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's command line on ``argv`` (default ``sys.argv[1:]``); 0 when it finishes.

    lm-eval reads ``sys.argv``, so it is set to ``argv`` for the run and put back after.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    require("lm_eval", "mptlml eval (the lm-evaluation-harness command line)")
    check_device_flag(args)  # before lm-eval's command line is imported and indexes its tasks
    check_model_args_flag(args)
    from lm_eval.__main__ import cli_evaluate

    if not args or any(a in ("-h", "--help") for a in args):
        print(HELP)
    out = output_dir(args)
    saved = sys.argv
    MPTLM.default_mc_dir = None if out is None else str(out)
    sys.argv = ["mptlml eval", *args]
    try:
        with _harness_wrapped():
            cli_evaluate()
    finally:
        sys.argv = saved
        MPTLM.default_mc_dir = None
        shutdown_distributed()
    return 0


def run(argv: list[str] | None = None) -> int:
    """``python -m mptlml.lm_eval``: :func:`main`, a bad argument said in one line, as
    ``mptlml eval`` says it (``mptlml eval: error: ...``, exit code 2)."""
    try:
        return main(argv)
    except (ValueError, TypeError, OSError, ModuleNotFoundError) as exc:
        print(f"mptlml eval: error: {exc}", file=sys.stderr)
        return 2
