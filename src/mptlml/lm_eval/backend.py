"""The lm-eval model ``mptlml``: lm-eval's requests answered by the MPT bound, with their errors.

:class:`MPTLM` is an ``lm_eval.api.model.LM``. Every request becomes a
question of :func:`mptlml.compare` (the conditional MPT bound, sizes drawn
over stratified rates, the whole continuation's mask scored once exactly):

``loglikelihood`` (context, continuation)
    The conditional bound of log p(continuation | context): the continuation's
    tokens masked, the context always visible. The requests of one document
    that share a context (the K candidates of a multiple-choice question) are
    one question, scored on common masks, so their differences, which decide
    the answer, carry a paired standard error; a lone request is a question of
    one. ``is_greedy`` is :func:`~mptlml.lm_eval.greedy.greedy_reproduces`.
``loglikelihood_rolling`` (text,)
    The full-sequence bound of the text (a question of one, no context). A text
    longer than the model is cut into windows: the first of the model's full
    length, each next one of half of it, scored given as many preceding tokens
    as fit (the chain rule with a truncated context, as lm-eval does for causal
    models), and the windows' bounds summed (their variances too).
``generate_until``
    Refused: the backend scores text.

Batching and processes. Each call gathers every process's requests (lm-eval
splits the documents between the processes of ``accelerate launch``), puts them
in one order (task, document, request index) and hands them to mptlml in one
call, which scores them in length-bucketed forward passes under the token
budget and, under a launcher, shares the chunks between the processes itself. A
question's masks are drawn from the run's seed and its own texts, so a run
gives the same numbers with one process or several, and a request the same
number whatever other documents are in the run.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from .._optional import require
from .._scoring.distributed import (
    barrier,
    distributed_context,
    gather,
    launched,
    resolve_device,
    shard,
)
from .._validation import MONTE_CARLO_OPTIONS, SEED_INT, check_options, check_positive_int
from ..estimators.compare import EXACT_LENGTH, compare
from ..estimators.llada import llada_questions
from ..models import MaskedLM
from ..models.sequence_input import context_bos, encode_with_context, window_pairs
from ..seeds import spawn, text_key
from .greedy import greedy_reproduces
from .peers import ALIASES, PEER_ARGUMENTS, translate
from .records import (
    RecordLog,
    check_log_path,
    pair_records,
    rolling_records,
    summary_lines,
)

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:
    require("lm_eval", "mptlml.lm_eval (the lm-evaluation-harness backend)")  # names the extra
    raise

__all__ = ["MPTLM"]

#: lm-eval's logger namespace: these lines show where lm-eval's own do
logger = logging.getLogger("lm_eval.mptlml")

#: how requests are scored: mptlml.compare, or LLaDA's own estimator (to reproduce it)
SCHEMES = ("mptlml", "llada")
#: ``mc_log`` in the results' config until the command line names the file
BESIDE_RESULTS = "beside the results file"
#: mptlml.compare's first round when ``mc_num`` does not set it
_COMPARE_NUM_MASKS = int(inspect.signature(compare).parameters["num_masks"].default)
#: loading options passed to ``MaskedLM.from_pretrained`` (transformers' among them)
_LOADING = ("tokenizer", "mask_token_id", "trust_remote_code", "dtype", "add_special_tokens",
            "revision", "autocast", "attn_implementation", "local_files_only", "cache_dir",
            "corruption", "allow_unknown")
#: the loading options of ``pretrained=antiberty`` (MaskedLM.antiberty)
_ANTIBERTY = ("dtype", "autocast", "corruption", "allow_unknown")
#: settings of the Monte Carlo estimate and of the run
_SETTINGS = ("scheme", "num_masks", "target_se", "max_masks", "mc_num", "decide", "seed",
             "token_budget", "batch_size", "max_length", "greedy", "cfg", "mc_log", "progress")
#: the settings that are numbers or flags: a string value is read by lm-eval's own rule
#: (``lm_eval.utils.handle_arg_string``: "true" -> True, "8" -> 8, "0.1" -> 0.1)
_VALUED = ("num_masks", "target_se", "max_masks", "mc_num", "decide", "seed", "token_budget",
           "batch_size", "max_length", "greedy", "cfg", "progress", "add_bos_token")
#: the Monte Carlo options, checked by the one table (mptlml._validation.MONTE_CARLO_OPTIONS);
#: here num_masks may be left out (compare's default) and a seed is an int
_OVERRIDES = {"num_masks": [*MONTE_CARLO_OPTIONS["num_masks"], None], "seed": [SEED_INT]}


@dataclass(frozen=True, order=True)
class _Key:
    """One request, by lm-eval's keys and its text: sortable, hashable, picklable."""

    task: str
    doc_id: int
    idx: int
    args: tuple[str, ...]


def _key(request: Any) -> _Key:
    task = request.task_name
    doc = request.doc_id
    return _Key("" if task is None else str(task), -1 if doc is None else int(doc),
                int(request.idx), tuple(str(a) for a in request.args))


def _harness_device(device: str) -> str:
    """lm-eval's ``--device`` (default ``cuda:0``) as the device this process scores on.

    ``model_args device=`` takes precedence over it. Under a launcher a CUDA device means
    each process's own GPU (``cuda:LOCAL_RANK``); without CUDA the CPU, as lm-eval's own
    backends fall back.
    """
    if not device.startswith("cuda"):
        return device
    if not torch.cuda.is_available():
        logger.info("lm-eval's --device %s (its default is cuda:0): CUDA is not available "
                    "here; scoring on the CPU.", device)
        return "cpu"
    return "cuda" if launched() else device


def _content_seed(seed: int, args: list[tuple[str, ...]]) -> int:
    """A question's seed from the run's seed and its texts: the same in any split of the run."""
    return spawn(seed, text_key(json.dumps([list(a) for a in args])))


def _budget(mc_num: int, num_masks: int | None, max_masks: int | None
            ) -> tuple[int, int]:
    """LLaDA's / Dream's ``mc_num`` as :func:`mptlml.compare`'s ``(num_masks, max_masks)``.

    A fixed budget of ``mc_num`` masked inputs per request (``max_masks``, the same unit:
    the whole continuation's row, scored once, and ``mc_num - 1`` draws, in pairs: an even
    ``mc_num`` is spent as ``mc_num - 1``), the first round of ``min(num_masks, draws)``.
    At least 3 (one pair and the whole continuation): 1 and 2 are spent as 3, announced.
    """
    if max_masks is not None:
        raise TypeError(f"model_args mc_num={mc_num} and max_masks={max_masks} are one budget "
                        "(LLaDA's and Dream's name, and mptlml's); pass one of them.")
    budget = max(3, mc_num)
    if budget != mc_num:
        logger.warning("mc_num=%d: mptlml.compare draws masks in pairs (two per rate stratum) "
                       "besides the whole continuation's, so each request gets %d masked "
                       "inputs (continuations of up to %d tokens are scored on every mask, "
                       "exactly).", mc_num, budget, EXACT_LENGTH)
    draws = (budget - 1) // 2 * 2  # the whole continuation's row counts
    first = _COMPARE_NUM_MASKS if num_masks is None else num_masks
    if first > draws:
        if num_masks is not None:
            raise ValueError(f"model_args num_masks={num_masks} draws and the whole "
                             f"continuation's row are more than mc_num={mc_num} masked inputs "
                             f"per request; lower num_masks to at most {draws} or leave it out.")
        first = draws
    return first, budget


def _content_limit(model: MaskedLM, max_length: int | None) -> int:
    """Content tokens one scored input may hold.

    ``max_length`` (LLaDA's and Dream's) counts every token of the input, the
    model's special tokens included; the model's own length bounds it too.
    """
    frame = len(model.prefix) + len(model.suffix)
    limit = model.max_content_length
    if max_length is not None:
        if max_length <= frame:
            raise ValueError(f"model_args max_length={max_length} leaves no room for a token "
                             f"beside the model's {frame} special tokens; pass more.")
        limit = min(limit, max_length - frame)
    return limit


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"model_args {name} must be true or false, got {value!r}.")


def _refuse_unknown(loading: dict[str, Any]) -> None:
    """Refuse the names of ``loading`` (model_args past MPTLM's own and LLaDA's and Dream's,
    translated) that are no loading option."""
    unknown = sorted(set(loading) - set(_LOADING))
    if unknown:
        raise TypeError(
            f"mptlml model_args: unknown {unknown}. Loading takes pretrained, device, "
            f"{', '.join(_LOADING)}; scoring takes {', '.join(_SETTINGS)}; LLaDA's and "
            f"Dream's {', '.join(PEER_ARGUMENTS)} are taken too.")


def check_arg_names(args: dict[str, Any]) -> None:
    """Refuse a model_args name that :class:`MPTLM` refuses, without loading anything.

    The command line calls it before lm-eval indexes its tasks, so that a misspelt
    argument costs no more than the imports. Raises what ``MPTLM(**args)`` raises for the
    names (:func:`~mptlml.lm_eval.peers.translate`'s refusals, then the unknown ones).
    """
    own = set(inspect.signature(MPTLM.__init__).parameters) - {"self", "loading"}
    loading = translate({k: v for k, v in args.items() if k not in own})
    _refuse_unknown({k: v for k, v in loading.items() if k not in ("pretrained", "greedy", "cfg")})


@register_model("mptlml")
class MPTLM(LM):
    """A masked LM (or masked-diffusion LM) in lm-evaluation-harness, scored by MPT.

    Parameters
    ----------
    pretrained : str, path or MaskedLM
        A model directory or hub id for :meth:`mptlml.models.MaskedLM.from_pretrained`,
        ``"antiberty"`` (the bundled :meth:`~mptlml.models.MaskedLM.antiberty`, as
        ``mptlml curve --model antiberty``), or a ready
        :class:`~mptlml.models.MaskedLM` (the Python route).
    **loading
        LLaDA's ``model_path``, ``mask_id``, ``is_check_greedy`` and Dream's
        ``nll_type``, ``log_type``, ``parallelize``, ``autogptq``
        (:mod:`mptlml.lm_eval.peers`; their generation options are refused), and
        ``tokenizer``, ``mask_token_id``, ``trust_remote_code``, ``dtype``,
        ``add_special_tokens``, ``revision``, ``autocast``, ``attn_implementation``,
        ``local_files_only``, ``cache_dir``, ``corruption``, ``allow_unknown``: as for
        ``MaskedLM.from_pretrained`` (``mask_token_id`` and ``trust_remote_code`` for a
        masked-diffusion LM such as LLaDA); any other name is refused.
    device : str, optional
        ``"cuda"``, ``"cpu"``, ...; under ``accelerate launch`` each process takes
        ``cuda:LOCAL_RANK`` (or the CPU). Default: lm-eval's ``--device`` (a CUDA
        device there is the CPU where CUDA is not available, each process's own GPU
        under a launcher), else a GPU when there is one.
    num_masks : int, optional
        Masks per request in the first round of draws (even; :func:`mptlml.compare`'s
        default when not given), besides the one mask of the whole continuation.
    target_se : float, optional
        Keep drawing rounds until every request's standard error is at most this (nats).
    max_masks : int, optional
        Most masked inputs scored per request (candidate), all rounds together, the whole
        continuation's one included: :func:`mptlml.compare`'s ``max_masks``, the cap of
        ``target_se`` or ``decide`` (default: 512 draws, and 128); alone, a fixed budget spent
        whole. A continuation short enough to be scored on every mask costs its 2^T - 1
        masks whatever the cap.
    decide : bool
        Multiple-choice questions: keep drawing rounds while the leader is not
        ahead of every other candidate by its paired-SE threshold, up to
        ``max_masks`` (:func:`mptlml.compare`'s sequential rule).
    seed : int
        Seed of every mask (default 0: a run is reproducible). A request's masks
        come from the seed and its own texts.
    token_budget, batch_size : int
        Padded tokens per forward pass; at most this many inputs per forward
        pass (optional). With ``scheme="llada"``, ``batch_size`` is LLaDA's: the
        masks of one systematic batch (default 32; lm-eval's ``--batch_size``
        sets it, as in LLaDA's adapter).
    scheme : {"mptlml", "llada"}
        ``"mptlml"`` (default): :func:`mptlml.compare`. ``"llada"``: LLaDA's own
        estimator (:func:`mptlml.estimators.llada_scores`: ``mc_num`` masks per
        request, default 128, counts systematic per batch, weight L / l), each
        candidate on its own masks, with the standard error of its batch means:
        reproduce a published LLaDA number first, then switch.
    greedy : bool
        Compute ``is_greedy`` by greedy unmasking (default True; about T extra
        forward rows per request). False: every ``is_greedy`` is False, announced
        once, and metrics built on it (a ``loglikelihood`` task's ``acc``) are void.
    mc_log : path, optional
        The JSON-lines file of per-request standard errors and costs
        (:mod:`mptlml.lm_eval.records`). Default: beside lm-eval's ``--output_path``
        when run by ``python -m mptlml.lm_eval``; none otherwise (the summary
        still goes into the results).
    progress : bool
        Progress bars of the scoring.
    mc_num : int, optional
        LLaDA's and Dream's name: a fixed budget of this many masked inputs per request
        (``max_masks`` alone; :func:`mptlml.compare` draws masks in pairs besides the
        whole continuation's, so an even N is spent as N - 1, and 1 or 2 as 3,
        announced). Not with ``max_masks``.
    cfg : float
        Classifier-free guidance w (LLaDA's ``cfg``; Dream's
        ``classifier_free_guidance`` is w + 1): 0, no guidance.
    max_length : int, optional
        Most tokens of one scored input, special tokens included (LLaDA's and
        Dream's ``max_length``): contexts are cut on the left to fit, as for the
        model's own length.
    add_bos_token : bool
        Dream's: the tokenizer's BOS token before every scored input's context, as
        part of the model's frame (always visible, never masked, scored or cut, and
        counted by ``max_length``: :meth:`~mptlml.models.MaskedLM.with_prefix`);
        nothing more where the frame leads with it already (the Dream family's
        convention, :mod:`mptlml.models.conventions`).
    """

    #: lm-eval's ``--output_path`` under :func:`mptlml.lm_eval.main`: the records then go
    #: beside its results file (set there)
    default_mc_dir: str | None = None
    #: the records and summary of the last run, until the command line writes them
    pending_run: tuple[list[dict[str, Any]], dict[str, dict[str, Any]]] | None = None
    #: the last model built (the command line asks it for its summary where lm-eval does not)
    last: Callable[[], MPTLM | None] | None = None
    #: under the command line (set there): ``last`` holds the model itself, since lm-eval
    #: 0.4.8 drops it before the run's summary is asked for (it never calls get_model_info)
    hold_last: bool = False

    def __init__(self, pretrained: str | os.PathLike | MaskedLM | None = None, *,
                 device: str | None = None, num_masks: int | None = None,
                 target_se: float | None = None,
                 max_masks: int | None = None, decide: bool = False, seed: int = 0,
                 token_budget: int = 8192, batch_size: int | None = None,
                 greedy: bool | None = None,
                 mc_log: str | os.PathLike | None = None, progress: bool = False,
                 mc_num: int | None = None, cfg: float = 0.0, max_length: int | None = None,
                 add_bos_token: bool = False, scheme: str = "mptlml",
                 **loading: Any) -> None:
        super().__init__()
        loading = translate({**loading, **({} if cfg == 0.0 else {"cfg": cfg})})
        cfg = loading.pop("cfg", 0.0)
        for name in ("pretrained", "greedy"):  # LLaDA's model_path, is_check_greedy
            if name in loading:
                if (pretrained if name == "pretrained" else greedy) is not None:
                    theirs = next(k for k, v in ALIASES.items() if v == name)
                    raise TypeError(f"model_args {theirs} and {name} are one argument (LLaDA's "
                                    "name and mptlml's); pass one of them.")
                if name == "pretrained":
                    pretrained = loading.pop(name)
                else:
                    greedy = loading.pop(name)
        _refuse_unknown(loading)
        if cfg and greedy is not False:
            raise ValueError(f"model_args cfg={cfg!r} with the greedy check: is_greedy would "
                             "be computed without guidance. Pass is_check_greedy=false (as "
                             "LLaDA's guided runs do) or cfg=0.")
        if pretrained is None:
            raise ValueError("mptlml model_args need pretrained=DIR_OR_HUB_ID (a masked LM, or "
                             "a masked-diffusion LM with mask_token_id=...).")
        check_options("mptlml model_args", overrides=_OVERRIDES, num_masks=num_masks,
                      target_se=target_se, max_masks=max_masks, decide=decide, seed=seed,
                      token_budget=token_budget, batch_size=batch_size, progress=progress)
        for name, value in (("mc_num", mc_num), ("max_length", max_length)):
            if value is not None:
                check_positive_int(value, f"model_args {name}")
        if num_masks is not None and num_masks % 2:
            raise ValueError(f"model_args num_masks must be even (mptlml.compare draws two "
                             f"masks per rate stratum), got {num_masks}.")
        if scheme not in SCHEMES:
            raise ValueError(f"model_args scheme={scheme!r}: pass one of {SCHEMES} ('mptlml': "
                             "mptlml.compare; 'llada': LLaDA's own estimator, to reproduce "
                             "its numbers).")
        self.scheme = scheme
        if scheme == "llada":
            given = [k for k, v in (("num_masks", num_masks), ("target_se", target_se),
                                    ("max_masks", max_masks), ("decide", decide)) if v]
            if given:
                raise ValueError(f"model_args {given} are mptlml.compare's; scheme=llada draws "
                                 "mc_num masks per request in batches of batch_size, as LLaDA "
                                 "does. Drop them, or leave scheme out.")
            mc_num = 128 if mc_num is None else mc_num  # LLaDA's defaults
            batch_size = 32 if batch_size is None else batch_size
            if mc_num % batch_size:
                raise ValueError(f"model_args mc_num={mc_num} is not a multiple of batch_size="
                                 f"{batch_size} (LLaDA's masks per batch); pass a multiple.")
        elif mc_num is not None:
            num_masks, max_masks = _budget(mc_num, num_masks, max_masks)
        if scheme == "mptlml":  # after mc_num became max_masks: the first round fits in it
            first = _COMPARE_NUM_MASKS if num_masks is None else num_masks
            if max_masks is not None and max_masks < first + 1:  # + the whole continuation
                given = "" if num_masks is not None else ", mptlml.compare's default"
                raise ValueError(f"model_args max_masks={max_masks} (masked inputs per request) "
                                 f"is below the first round's num_masks={first}{given} draws "
                                 f"and the whole continuation's row: raise max_masks to at least "
                                 f"{first + 1}" + (f", or pass model_args num_masks=N (even, at "
                                                   f"most {(max_masks - 1) // 2 * 2})"
                                                   if max_masks >= 3 else "") + ".")
        if mc_log is not None:
            check_log_path(Path(mc_log))  # before the model is loaded
        self.greedy = _flag(True if greedy is None else greedy, "greedy")
        self.cfg = float(cfg)
        self.mc_num = mc_num
        self.decide = bool(decide)
        self.progress = bool(progress)
        self.num_masks = num_masks
        self.target_se = target_se
        self.max_masks = max_masks
        self.seed = int(seed)
        self.token_budget = int(token_budget)
        self.batch_size = batch_size
        # the process group first (under a launcher each rank takes its own device)
        if isinstance(pretrained, MaskedLM):
            if loading:
                raise TypeError(f"{sorted(loading)} apply when loading a model; pretrained is "
                                "a MaskedLM already.")
            lm = pretrained if device is None else pretrained.to(resolve_device(device))
            self._ctx = distributed_context(cpu=lm.device.type == "cpu")
        else:
            dev = resolve_device(device)
            self._ctx = distributed_context(cpu=dev.type == "cpu")
            if str(pretrained).lower() == "antiberty":  # as `mptlml curve --model antiberty`
                other = sorted(set(loading) - set(_ANTIBERTY))
                if other:
                    raise TypeError(f"model_args {other} do not apply to pretrained=antiberty "
                                    f"(bundled, with its own tokenizer); it takes "
                                    f"{', '.join(_ANTIBERTY)}.")
                lm = MaskedLM.antiberty(device=dev, **loading)
            else:
                lm = MaskedLM.from_pretrained(pretrained, device=dev, **loading)
        self._bos = context_bos(lm, _flag(add_bos_token, "add_bos_token"))
        if self._bos:  # the BOS joins the model's frame: visible, never masked, scored or cut
            lm = lm.with_prefix(self._bos)
        self.model = lm
        self._limit = _content_limit(lm, max_length)
        self.max_length = max_length
        self._rank, self._world_size = self._ctx.rank, self._ctx.world
        self._device = lm.device
        # no mc_log under the command line: the records go beside lm-eval's results file,
        # named by its timestamp, when lm-eval saves it (mptlml.lm_eval.command)
        self.beside_results = mc_log is None and self.default_mc_dir is not None
        self.log = RecordLog(mc_log, write=self._ctx.main)
        self._questions = 0
        self._announced_greedy = False
        type(self).last = ((lambda model=self: model) if self.hold_last else
                           weakref.ref(self))

    # ------------------------------------------------------------------ lm-eval plumbing
    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: dict | None = None) -> MPTLM:
        """``--model_args k=v,...`` plus lm-eval's ``--device`` / ``--batch_size``."""
        require("lm_eval", "mptlml.lm_eval (the lm-evaluation-harness backend)")
        from lm_eval.utils import simple_parse_args_string

        return cls._create(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> MPTLM:
        """``model_args`` as a dict, plus lm-eval's ``device`` / ``batch_size``.

        A number or flag given as a string is read as lm-eval reads ``--model_args``
        (``lm_eval.utils.handle_arg_string``, as :meth:`create_from_arg_string` does), then
        checked with the Python door's types.
        """
        require("lm_eval", "mptlml.lm_eval (the lm-evaluation-harness backend)")
        from lm_eval.utils import handle_arg_string

        return cls._create({k: handle_arg_string(v) if k in _VALUED and isinstance(v, str)
                            else v for k, v in arg_dict.items()}, additional_config)

    @classmethod
    def _create(cls, args: dict[str, Any], additional: dict | None) -> MPTLM:
        extra = {k: v for k, v in (additional or {}).items() if v is not None}
        device = extra.pop("device", None)
        if device is not None and args.get("device") is None:
            args["device"] = _harness_device(str(device))
        harness = {k: extra.pop(k) for k in ("batch_size", "max_batch_size") if k in extra}
        if args.get("scheme") == "llada" and "batch_size" in harness:
            # LLaDA's adapter takes lm-eval's --batch_size as its masks per batch
            size = harness.pop("batch_size")
            if str(size) != "auto" and args.get("batch_size") is None:
                args["batch_size"] = int(size)
        if any(str(v) not in ("1", "auto") for v in harness.values()):
            warnings.warn(
                f"lm-eval's {harness} does not apply to mptlml: it batches masked inputs by "
                "token budget. Use --model_args token_budget=N (padded tokens per forward "
                "pass) or batch_size=N (inputs per forward pass).", UserWarning, stacklevel=3)
        if extra:
            raise TypeError(f"mptlml does not take lm-eval's {sorted(extra)}.")
        return cls(**args)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.model.tokenizer, "name_or_path", self.model.name)).replace(
            "/", "__")

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's ``tensor``, stacked (lm-eval counts requests per process with it)."""
        if self.world_size == 1:
            return tensor
        parts = [torch.as_tensor(p) for p in gather(tensor.detach().cpu(), self._ctx)]
        out = torch.stack(parts) if parts[0].ndim == 0 else torch.cat(parts)
        return out.to(tensor.device)

    @property
    def accelerator(self) -> SimpleNamespace:
        """What lm-eval 0.4.8's evaluator asks of a model on several processes (later
        versions call all_gather and barrier): ``gather`` and ``wait_for_everyone``."""
        return SimpleNamespace(gather=self.all_gather, wait_for_everyone=self.barrier)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        parts = gather(obj, self._ctx)
        return parts if self.rank == dst else None

    def barrier(self) -> None:
        if self.world_size > 1:
            barrier(self._ctx)

    def get_model_info(self) -> dict[str, Any]:
        """The model, the settings and the run's Monte Carlo summary (into lm-eval's results).

        lm-eval calls this once, after all requests, on the main process.
        """
        summary = self.log.close_run()
        if self.beside_results:  # for the command line to write beside the results file
            type(self).pending_run = self.log.finished
        for line in summary_lines(summary):
            logger.info("Monte Carlo: %s", line)
        for task, s in summary.items():
            if s["budget_spent"] and (self.target_se is not None or self.decide):
                logger.warning(
                    "%s: %d requests spent %s before reaching %s; their standard errors are "
                    "in the Monte Carlo log. Raise max_masks.", task, s["budget_spent"],
                    f"max_masks={self.max_masks} masked inputs" if self.max_masks else
                    "mptlml.compare's default cap (128 masked inputs with decide, 512 draws "
                    "with target_se)",
                    "target_se" if self.target_se is not None else "a decision")
            if s.get("undecided"):
                logger.warning(
                    "%s: %d of %d multiple-choice decisions are not decided (the leader is not "
                    "ahead of every other candidate by %.3g paired standard errors): Monte "
                    "Carlo noise can move its accuracy by up to %.3g. More masks (decide=true, "
                    "a larger max_masks) decide them.", task, s["undecided"], s["questions"],
                    s["z_threshold"], s["undecided_share"])
        return {"mptlml": {
            "model": self.model.name, **self.model.placement(), "scheme": self.scheme,
            "num_masks": self.num_masks,
            "target_se": self.target_se, "max_masks": self.max_masks, "decide": self.decide,
            "mc_num": self.mc_num, "cfg": self.cfg, "max_length": self.max_length,
            "add_bos_token": bool(self._bos),
            "seed": self.seed, "token_budget": self.token_budget, "greedy": self.greedy,
            "world_size": self.world_size,
            "mc_log": (str(self.log.path) if self.log.path is not None else
                       BESIDE_RESULTS if self.beside_results else None),
            "monte_carlo": summary}}

    # ------------------------------------------------------------------ requests
    def _everyone(self, keys: list[_Key]) -> list[_Key]:
        """Every process's requests, without repeats, in one canonical order."""
        allk = [k for part in gather(keys, self._ctx) for k in part]
        return sorted(set(allk))

    # ---------------------------------------------------------------- loglikelihood
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False
                      ) -> list[tuple[float, bool]]:
        """log p(continuation | context) and is_greedy for each (context, continuation)."""
        self.log.check_open()
        keys = [_key(r) for r in requests]
        if not keys and self.world_size == 1:
            return []
        everyone = self._everyone(keys)
        records = self._score_pairs(everyone)
        self.log.add([records[k] for k in everyone])
        return [(float(records[k]["loglikelihood"]), bool(records[k]["is_greedy"]))
                for k in keys]

    def _pair_ids(self, keys: list[_Key]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Context and continuation ids of each pair (no BOS: it is the frame's), in one pass of
        :func:`~mptlml.models.sequence_input.encode_with_context`; each continuation's
        unknown tokens checked on its own, naming its task, document and choice."""
        ids, nctx = encode_with_context(
            self.model, [k.args[0] for k in keys], [k.args[1] for k in keys],
            check_length=False, word_warnings=False,
            names=[f"task {k.task!r}, document {k.doc_id}, choice {k.idx} ({k.args[1]!r})"
                   for k in keys])
        return ([t[:n] for t, n in zip(ids, nctx, strict=True)],
                [t[n:] for t, n in zip(ids, nctx, strict=True)])

    def _score_pairs(self, keys: list[_Key]) -> dict[_Key, dict[str, Any]]:
        """Records of (context, continuation) requests: one question per document and context."""
        ctx_ids, cont_ids = self._pair_ids(keys)
        limit = self._limit
        groups: dict[tuple[str, int, str], list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            groups[(k.task, k.doc_id, k.args[0])].append(i)
        questions = list(groups.values())
        kept: dict[int, torch.Tensor] = {}
        for members in questions:
            longest = max(len(cont_ids[i]) for i in members)
            if longest > limit:
                k = keys[members[0]]
                raise ValueError(
                    f"task {k.task!r}, document {k.doc_id}: a continuation of {longest} tokens "
                    f"is longer than the model's {limit} content tokens; mptlml cannot score it "
                    "given its context (loglikelihood_rolling windows long texts).")
            room = limit - longest  # the context's last tokens that fit beside the longest
            for i in members:
                c = ctx_ids[i]
                kept[i] = c[len(c) - room:] if len(c) > room else c
        cmp = self._compare(
            [kept[m[0]].tolist() for m in questions],
            [[cont_ids[i].tolist() for i in m] for m in questions],
            [_content_seed(self.seed, [keys[i].args for i in m]) for m in questions])
        records = pair_records(
            keys, questions, cmp, num_tokens=[len(t) for t in cont_ids],
            context_tokens=[len(kept[i]) for i in range(len(keys))],
            dropped=[len(ctx_ids[i]) - len(kept[i]) for i in range(len(keys))],
            first_id=self._questions)
        self._questions += len(questions)
        greedy = self._greedy(keys, kept, cont_ids)
        for k, g in zip(keys, greedy, strict=True):
            records[k]["is_greedy"] = g
        return records

    def _compare(self, contexts: list[list[int]], candidates: list[list[list[int]]],
                 seeds: list[int]) -> Any:
        """The questions scored by the run's scheme: :func:`mptlml.compare`'s result, or
        LLaDA's estimate of each candidate in the same fields
        (:func:`~mptlml.estimators.llada.llada_questions`)."""
        if self.scheme == "llada":
            return llada_questions(self.model, contexts, candidates, seeds, self.mc_num,
                                   int(self.batch_size), token_budget=self.token_budget,
                                   progress=self.progress, cfg_scale=self.cfg)
        return compare(self.model, contexts, candidates, seed=seeds, **self._compare_options())

    def _compare_options(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"token_budget": self.token_budget, "progress": self.progress,
                              "decide": self.decide, "cfg_scale": self.cfg}
        for name in ("num_masks", "target_se", "max_masks", "batch_size"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return kw

    def _greedy(self, keys: list[_Key], kept: dict[int, torch.Tensor],
                cont_ids: list[torch.Tensor]) -> list[bool | None]:
        """is_greedy of each pair, the pairs shared out between the processes."""
        if not self.greedy:
            if not self._announced_greedy:
                warnings.warn("greedy=false: every is_greedy is False, so metrics built on it "
                              "(the acc of a loglikelihood task such as LAMBADA, exact_match) "
                              "read 0; leave greedy on for them.", UserWarning, stacklevel=3)
                self._announced_greedy = True
            return [None] * len(keys)
        mine = shard(list(range(len(keys))), self._ctx)
        ids = [torch.cat([kept[i], cont_ids[i]]) for i in mine]
        got = greedy_reproduces(self.model, ids, [len(kept[i]) for i in mine],
                                token_budget=self.token_budget, batch_size=self.batch_size)
        out: dict[int, bool] = {}
        for part in gather(dict(zip(mine, got, strict=True)), self._ctx):
            out.update(part)
        return [out[i] for i in range(len(keys))]

    # ---------------------------------------------------------------- rolling
    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        """The MPT bound of log p(text) for each (text,), long texts in windows."""
        self.log.check_open()
        keys = [_key(r) for r in requests]
        if self.cfg:
            raise ValueError(f"model_args cfg={self.cfg}: guidance needs a context to guide by; "
                             "a perplexity task (loglikelihood_rolling) scores texts without "
                             "one. Run it with cfg=0.")
        if not keys and self.world_size == 1:
            return []
        everyone = self._everyone(keys)
        texts = [k.args[0] for k in everyone]
        ids = self.model.encode_groups([texts], check_length=False)[0] if everyone else []
        for k, t in zip(everyone, ids, strict=True):
            if not len(t):  # lm-eval's perplexity would count it as one word of probability 1
                raise ValueError(f"task {k.task!r}, document {k.doc_id}: the text is empty (no "
                                 "token); a perplexity task scores texts: remove the empty "
                                 "document from the task's data.")
        self.model.check_unknown(ids, names=[f"task {k.task!r}, document {k.doc_id}"
                                             for k in everyone])
        windows = [window_pairs(t, self._limit) for t in ids]
        seeds = [_content_seed(self.seed, [k.args, (str(w),)])
                 for k, ws in zip(everyone, windows, strict=True) for w in range(len(ws))]
        cmp = SimpleNamespace(scores=[], stderr=[], exact=[], num_masked_rows=[], stop_reason=[])
        if seeds:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always", RuntimeWarning)
                cmp = self._compare([c for ws in windows for c, _ in ws],
                                    [[t] for ws in windows for _, t in ws], seeds)
            for w in said:  # compare's words for its inputs: here windows of texts, no question
                text = re.sub(r"\bquestions\b", "text windows",
                              re.sub(r"\bquestion\b", "text window", str(w.message)))
                warnings.warn(text, w.category, stacklevel=2)
        records = rolling_records(everyone, [len(t) for t in ids], [len(ws) for ws in windows],
                                  cmp)
        self.log.add([records[k] for k in everyone])
        return [records[k]["loglikelihood"] for k in keys]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError(
            "mptlml scores text and does not generate: it answers loglikelihood "
            "(multiple-choice) and loglikelihood_rolling (perplexity) tasks. Run generation "
            "tasks (generate_until, e.g. gsm8k) with a model that generates, such as lm-eval's "
            "'hf' backend or a masked-diffusion LM's own sampler.")
