"""The lm-eval models ``mptlml``, ``llada_dist`` and ``dream``: requests answered by the MPT bound.

:class:`MPTLM` is an ``lm_eval.api.model.LM`` and an adapter: lm-eval's requests become
questions of :func:`mptlml.compare`, its settings come from ``--model_args``
(:mod:`mptlml.lm_eval.settings`, LLaDA's and Dream's through :mod:`mptlml.lm_eval.peers`),
and each request's Monte Carlo error goes to :mod:`mptlml.lm_eval.records`.

``loglikelihood`` (context, continuation)
    The conditional bound of log p(continuation | context), the context always visible and
    cut on the left to fit (:func:`~mptlml.models.sequence_input.fit_contexts`). The
    requests of one document sharing a context (a multiple-choice question's K candidates)
    are one question of ``compare``; ``is_greedy`` is
    :func:`~mptlml.lm_eval.greedy.greedy_reproduces` of the context as scored.
``loglikelihood_rolling`` (text,)
    The full-sequence bound of the text; a long text in windows (the first of the model's
    length, each next of half of it, given as many preceding tokens as fit), summed.
``generate_until`` (context, gen_kwargs)
    LLaDA's sampler (:func:`mptlml.generate`), its settings from LLaDA's or Dream's
    generation model_args, cut at the request's ``until`` (:mod:`mptlml.lm_eval.generation`).

Each call gathers every process's requests into one order (task, document, index) and
scores them in one ``compare`` call, which shares the work between the processes; a
question's masks come from the run's seed and its own texts, so the numbers do not depend
on the number of processes or on the other documents of the run.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import warnings
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from .._optional import require
from .._scoring.distributed import barrier, gather, shard
from ..estimators.compare import compare
from ..models import MaskedLM
from ..models.sequence_input import content_limit, context_bos, fit_contexts, window_pairs
from ..seeds import spawn, text_key
from .generation import answer_generation
from .greedy import greedy_reproduces
from .records import (
    RecordLog,
    group_weights,
    pair_records,
    rolling_records,
    warn_summary,
    warn_windows,
)
from .settings import RunSettings, load_model, read_model_args, with_harness

try:
    import lm_eval.evaluator
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:
    require("lm_eval", "mptlml.lm_eval (the lm-evaluation-harness backend)")  # names the extra
    raise

__all__ = ["MPTLM", "MPTLMDream", "MPTLMLLaDA"]

#: lm-eval's logger namespace: these lines show where lm-eval's own do
logger = logging.getLogger("lm_eval.mptlml")

#: ``mc_log`` in the results' config until the command line names the file
BESIDE_RESULTS = "beside the results file"


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


def _content_seed(seed: int, args: list[tuple[str, ...]]) -> int:
    """A question's seed from the run's seed and its texts: the same in any split of the run."""
    return spawn(seed, text_key(json.dumps([list(a) for a in args])))


def _tasks(tree: Any) -> list[tuple[str, Any]]:
    """(name, task) of every task in lm-eval's task dict (any nesting of its versions)."""
    out: list[tuple[str, Any]] = []
    items = tree.items() if isinstance(tree, dict) else []
    for name, value in items:
        if isinstance(value, dict):
            out += _tasks(value)
        elif hasattr(value, "OUTPUT_TYPE"):
            out.append((str(name), value))
    return out


def _checking_tasks_first(evaluate: Callable[..., Any]) -> Callable[..., Any]:
    """lm-eval's ``evaluate``, after :meth:`MPTLM.check_tasks` when its model is an MPTLM:
    what cannot apply to a task is refused before any request of any task is scored."""
    if getattr(evaluate, "_mptlml_checks_tasks", False):
        return evaluate

    @functools.wraps(evaluate)
    def checked(*args: Any, **kwargs: Any) -> Any:
        lm = kwargs.get("lm", args[0] if args else None)
        if isinstance(lm, MPTLM):
            lm.check_tasks(kwargs.get("task_dict", args[1] if len(args) > 1 else {}))
        return evaluate(*args, **kwargs)

    checked._mptlml_checks_tasks = True  # type: ignore[attr-defined]
    return checked


@register_model("mptlml")
class MPTLM(LM):
    """A masked LM (or masked-diffusion LM) in lm-evaluation-harness, scored by MPT.

    Parameters
    ----------
    pretrained : str, path or MaskedLM
        A model directory or hub id for :meth:`mptlml.models.MaskedLM.from_pretrained`,
        ``"antiberty"`` (the bundled :meth:`~mptlml.models.MaskedLM.antiberty`), or a
        ready :class:`~mptlml.models.MaskedLM` (the Python route).
    device : str, optional
        ``"cuda"``, ``"cpu"``, ...; under ``accelerate launch`` each process takes
        ``cuda:LOCAL_RANK`` (or the CPU). Default: lm-eval's ``--device`` (the CPU where
        CUDA is not available), else a GPU when there is one.
    **model_args
        How requests are scored, :class:`~mptlml.lm_eval.settings.RunSettings` (``estimator``,
        ``num_masks``, ``target_se``, ``max_masks``, ``mc_num``, ``batch``, ``decide``,
        ``seed``, ``token_budget``, ``batch_size``, ``max_length``, ``greedy``, ``cfg``,
        ``mc_log``, ``progress``, ``add_bos_token``); LLaDA's and Dream's arguments
        (:data:`mptlml.lm_eval.peers.PEERS`); and the loading options of
        ``MaskedLM.from_pretrained`` (``tokenizer``, ``mask_token_id``,
        ``trust_remote_code``, ``dtype``, ``add_special_tokens``, ``revision``,
        ``autocast``, ``attn_implementation``, ``local_files_only``, ``cache_dir``,
        ``corruption``, ``allow_unknown``). Any other name is refused, before loading.
    """

    #: lm-eval's model name (the peers' names add their adapters' defaults)
    model_name = "mptlml"
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
                 device: str | None = None, **model_args: Any) -> None:
        super().__init__()
        given = {} if pretrained is None else {"pretrained": pretrained}
        settings, loading = read_model_args({**given, **model_args}, model=self.model_name)
        self.settings: RunSettings = settings
        # the process group first (under a launcher each rank takes its own device)
        lm, self._ctx = load_model(loading, device)
        self._bos = context_bos(lm, settings.add_bos_token)
        if self._bos:  # the BOS joins the model's frame: visible, never masked, scored or cut
            lm = lm.with_prefix(self._bos)
        self.model = lm
        try:
            self._limit = content_limit(lm, settings.max_length)
        except ValueError as exc:
            raise ValueError(f"model_args {exc}") from None
        self._rank, self._world_size = self._ctx.rank, self._ctx.world
        self._device = lm.device
        # no mc_log under the command line: the records go beside lm-eval's results file,
        # named by its timestamp, when lm-eval saves it (mptlml.lm_eval.command)
        self.beside_results = settings.mc_log is None and self.default_mc_dir is not None
        self.log = RecordLog(settings.mc_log, write=self._ctx.main)  # the file made here
        self._questions = 0
        self._announced_greedy = False
        self._groups: dict[str, dict[str, Any]] = {}
        type(self).last = ((lambda model=self: model) if self.hold_last else
                           weakref.ref(self))

    def __getattr__(self, name: str) -> Any:
        """The run's settings as attributes (``lm.seed``, ``lm.cfg``, ``lm.mc_num``, ...)."""
        settings = self.__dict__.get("settings")
        if settings is not None and name in RunSettings.__dataclass_fields__:
            return getattr(settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        """``model_args`` as a dict, plus lm-eval's ``device`` / ``batch_size``; a number or
        flag given as a string is read as lm-eval reads ``--model_args``
        (``lm_eval.utils.handle_arg_string``)."""
        require("lm_eval", "mptlml.lm_eval (the lm-evaluation-harness backend)")
        from lm_eval.utils import handle_arg_string

        from .settings import VALUED

        return cls._create({k: handle_arg_string(v) if k in VALUED and isinstance(v, str)
                            else v for k, v in arg_dict.items()}, additional_config)

    @classmethod
    def _create(cls, args: dict[str, Any], additional: dict | None) -> MPTLM:
        return cls(**with_harness(args, additional, cls.model_name))

    def check_tasks(self, task_dict: Any) -> None:
        """Refuse, before any request is scored, a task the run's settings cannot score:
        guidance (``cfg``) on a perplexity task (its texts have no context to guide by)."""
        self._groups = group_weights(task_dict)  # for the group rows' MC SEs
        rolling = sorted(n for n, t in _tasks(task_dict)
                         if t.OUTPUT_TYPE == "loglikelihood_rolling")
        if self.cfg and rolling:
            raise ValueError(f"model_args {self.settings.name('cfg')}: guidance needs a context "
                             f"to guide by, and the perplexity task(s) {rolling} "
                             "(loglikelihood_rolling) score texts without one; nothing was "
                             "scored. Run them in a run with cfg=0.")

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
        warn_summary(summary, self.settings)
        return {"mptlml": {
            "model": self.model.name, **self.model.placement(), **self.settings.config(),
            "world_size": self.world_size, "groups": self._groups,
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
        records, scored = self._score_pairs(everyone)
        for k, g in zip(everyone, self._greedy(*scored), strict=True):
            records[k]["is_greedy"] = g
        self.log.add([records[k] for k in everyone])
        return [(float(records[k]["loglikelihood"]), bool(records[k]["is_greedy"]))
                for k in keys]

    def _score_pairs(self, keys: list[_Key]) -> tuple[dict[_Key, dict[str, Any]], Any]:
        """Records of (context, continuation) requests, one question per document and context;
        and the (context, continuation) ids scored (the contexts cut to fit,
        :func:`~mptlml.models.sequence_input.fit_contexts`)."""
        groups: dict[tuple[str, int, str], list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            groups[(k.task, k.doc_id, k.args[0])].append(i)
        questions = list(groups.values())
        seeds = [_content_seed(self.seed, [keys[i].args for i in m]) for m in questions]
        ctx, cont, dropped = fit_contexts(
            self.model, [k.args[0] for k in keys], [k.args[1] for k in keys], questions,
            self._limit, names=[f"task {k.task!r}, document {k.doc_id}, choice {k.idx} "
                                f"({k.args[1]!r})" for k in keys],
            group_names=[f"task {keys[m[0]].task!r}, document {keys[m[0]].doc_id}"
                         for m in questions])
        cmp = compare(self.model, [ctx[m[0]].tolist() for m in questions],
                      [[cont[i].tolist() for i in m] for m in questions], seed=seeds,
                      **self.settings.compare_options())
        records = pair_records(keys, questions, cmp, num_tokens=[len(t) for t in cont],
                               context_tokens=[len(t) for t in ctx], dropped=dropped,
                               first_id=self._questions)
        self._questions += len(questions)
        return records, (ctx, cont)

    def _pair_ids(self, keys: list[_Key]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Context and continuation ids of each pair as scored (no BOS: it is the frame's),
        each in a question of its own."""
        ctx, cont, _ = fit_contexts(self.model, [k.args[0] for k in keys],
                                    [k.args[1] for k in keys], [[i] for i in range(len(keys))],
                                    self._limit, names=[str(k) for k in keys],
                                    group_names=[str(k) for k in keys])
        return ctx, cont

    def _greedy(self, kept: list[torch.Tensor], cont: list[torch.Tensor]) -> list[bool | None]:
        """is_greedy of each pair (its context as scored, the continuation masked), the pairs
        shared out between the processes."""
        if not self.greedy:
            if not self._announced_greedy:
                warnings.warn(f"{self.settings.name('greedy')}=false: every is_greedy is False, "
                              "so metrics built on it (the acc of a loglikelihood task such as "
                              "LAMBADA, exact_match) read 0; leave it on for them.",
                              UserWarning, stacklevel=4)
                self._announced_greedy = True
            return [None] * len(kept)
        mine = shard(list(range(len(kept))), self._ctx)
        got = greedy_reproduces(self.model, [torch.cat([kept[i], cont[i]]) for i in mine],
                                [len(kept[i]) for i in mine], token_budget=self.token_budget,
                                batch_size=self.batch_size)
        out: dict[int, bool] = {}
        for part in gather(dict(zip(mine, got, strict=True)), self._ctx):
            out.update(part)
        return [out[i] for i in range(len(kept))]

    # ---------------------------------------------------------------- rolling
    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False
                              ) -> list[float]:
        """The MPT bound of log p(text) for each (text,), long texts in windows."""
        self.log.check_open()
        keys = [_key(r) for r in requests]
        if self.cfg:
            raise ValueError(f"model_args {self.settings.name('cfg')}={self.cfg}: guidance "
                             "needs a context to guide by; a perplexity task "
                             "(loglikelihood_rolling) scores texts without one. Run it with "
                             "cfg=0.")
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
                warnings.simplefilter("always")
                cmp = compare(self.model, [c for ws in windows for c, _ in ws],
                              [[t] for ws in windows for _, t in ws], seed=seeds,
                              **self.settings.compare_options())
            for w in said:  # compare's own summary speaks of questions: said below of windows
                if w.category is not RuntimeWarning:
                    warnings.warn(w.message, w.category, stacklevel=2)
            warn_windows(cmp)
        records = rolling_records(everyone, [len(t) for t in ids], [len(ws) for ws in windows],
                                  cmp)
        self.log.add([records[k] for k in everyone])
        return [records[k]["loglikelihood"] for k in keys]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Completions by LLaDA's sampler, cut at ``until`` (:mod:`mptlml.lm_eval.generation`)."""
        s = self.settings
        return answer_generation(self.model, [r.args for r in requests], s.generation,
                                 seed=s.seed, content_limit=self._limit,
                                 batch_size=s.batch_size)


@register_model("llada_dist")
class MPTLMLLaDA(MPTLM):
    """``--model llada_dist``: LLaDA's lm-eval model name, scored by mptlml.

    A published LLaDA command line (``--model llada_dist --model_args
    model_path=...,mc_num=128,...``) runs unchanged: its ``model_args`` as LLaDA's
    adapter reads them (:data:`~mptlml.lm_eval.peers.PEERS`), with its defaults (remote
    code, ``mc_num=128``: :data:`~mptlml.lm_eval.peers.MODEL_DEFAULTS`); lm-eval's
    ``--batch_size`` is LLaDA's masks per batch (``estimator=llada``'s ``batch``).
    """

    model_name = "llada_dist"


@register_model("dream")
class MPTLMDream(MPTLM):
    """``--model dream``: Dream's lm-eval model name, scored by mptlml (as
    :class:`MPTLMLLaDA`, with Dream's arguments and defaults)."""

    model_name = "dream"


# what cannot apply to a task (guidance on a perplexity task) refused before any scoring
lm_eval.evaluator.evaluate = _checking_tasks_first(lm_eval.evaluator.evaluate)
