"""The lm-eval model ``mptlml``: lm-eval's requests answered by the MPT bound, with their errors.

:class:`MPTLM` is an ``lm_eval.api.model.LM``:

``loglikelihood`` (context, continuation)
    The conditional MPT bound of log p(continuation | context): the
    continuation's tokens masked, the context always visible. The requests of
    one document that share a context (the K candidates of a multiple-choice
    question) are scored together on common masks by :func:`mptlml.compare`, so
    their differences, which decide the answer, carry a paired standard error;
    a lone request goes to :func:`mptlml.estimate_lml` with ``context=``.
    ``is_greedy`` is :func:`~mptlml.lm_eval.greedy.greedy_reproduces`.
``loglikelihood_rolling`` (text,)
    The full-sequence MPT bound of the text (:func:`mptlml.estimate_lml`). A
    text longer than the model's maximum is cut into windows: the first of the
    model's full length, each next one of half of it, scored given as many
    preceding tokens as fit (the chain rule with a truncated context, as lm-eval
    does for causal models), and the windows' bounds summed.
``generate_until``
    Refused: the backend scores text.

Batching and processes. Each call gathers every process's requests (lm-eval
splits the documents between the processes of ``accelerate launch``), puts them
in one canonical order (task, document, request index) and hands them to mptlml
in one call, which scores them in length-bucketed forward passes under the
token budget and, under a launcher, shares the chunks between the processes
itself. A request's masks are drawn from (seed, its place in that order), so a
run gives the same numbers with one process or several.
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

import mptlml

from ..estimation.distributed import distributed_context, gather, resolve_device, shard
from ..models import MaskedLM
from ..models.sequence_input import encode_with_context, tokenize
from .greedy import greedy_reproduces
from .records import RecordLog, summary_lines

__all__ = ["MPTLM"]

#: lm-eval's logger namespace: these lines show where lm-eval's own do
logger = logging.getLogger("lm_eval.mptlml")

#: loading options passed to ``MaskedLM.from_pretrained`` (transformers' among them)
_LOADING = ("tokenizer", "mask_token_id", "trust_remote_code", "dtype", "add_special_tokens",
            "revision", "autocast", "attn_implementation", "local_files_only", "cache_dir",
            "corruption", "allow_unknown")
#: settings of the Monte Carlo estimate and of the run
_SETTINGS = ("estimator", "num_masks", "target_se", "max_masks", "decide", "seed",
             "token_budget", "batch_size", "chunk_size", "greedy", "mc_log", "progress")
#: masks per size when neither num_masks nor target_se is given (2 is the least with an SE)
DEFAULT_NUM_MASKS = 4


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


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"model_args {name} must be true or false, got {value!r}.")


class _Unbounded:
    """The model's tokenisation without its length check (contexts are cut to fit later)."""

    def __init__(self, model: MaskedLM) -> None:
        self.model = model

    def encode(self, sequences: Any) -> list[torch.Tensor]:
        m = self.model
        return tokenize(sequences, m.tokenizer, vocab_size=m.vocab_size, preprocess=m.preprocess,
                        forbidden_ids=[m.mask_token_id])


@register_model("mptlml")
class MPTLM(LM):
    """A masked LM (or masked-diffusion LM) in lm-evaluation-harness, scored by MPT.

    Parameters
    ----------
    pretrained : str, path or MaskedLM
        A model directory or hub id for :meth:`mptlml.models.MaskedLM.from_pretrained`,
        or a ready :class:`~mptlml.models.MaskedLM` (the Python route).
    tokenizer, mask_token_id, trust_remote_code, dtype, add_special_tokens, revision, autocast, \
attn_implementation, local_files_only, cache_dir, corruption, allow_unknown
        As for ``MaskedLM.from_pretrained`` (``mask_token_id`` and
        ``trust_remote_code`` for a masked-diffusion LM such as LLaDA).
    device : str, optional
        ``"cuda"``, ``"cpu"``, ...; under ``accelerate launch`` each process takes
        ``cuda:LOCAL_RANK`` (or the CPU). Default: a GPU when there is one.
    estimator : str
        The Monte Carlo estimator (``"cumulative"``: P masks at every size).
    num_masks : int, optional
        P, masks per size (default :data:`DEFAULT_NUM_MASKS` unless ``target_se``).
    target_se : float, optional
        Draw masks until the requests' standard errors are about this (nats): their
        root mean square for single requests and texts (masks allocated over the
        mask sizes from a pilot, :func:`mptlml.estimate_lml`), each question's
        for multiple-choice candidates.
    max_masks : int, optional
        Most masked inputs per request (with ``target_se`` or ``decide``).
    decide : bool
        Multiple-choice questions: keep drawing masks while the leader is not
        ahead of the runner-up by 2 paired standard errors, up to ``max_masks``
        (:func:`mptlml.compare`'s ``decide=True``).
    seed : int
        Seed of every mask (default 0: a run is reproducible).
    token_budget, batch_size, chunk_size : int
        Padded tokens per forward pass; at most this many inputs per forward
        pass (optional); sequences per chunk of work (a process's unit under a launcher).
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
    """

    #: the directory ``mc_log`` defaults into (set by :func:`mptlml.lm_eval.main`)
    default_mc_dir: str | None = None

    def __init__(self, pretrained: str | os.PathLike | MaskedLM | None = None, *,
                 device: str | None = None, estimator: str = "cumulative",
                 num_masks: int | None = None, target_se: float | None = None,
                 max_masks: int | None = None, decide: bool = False, seed: int = 0,
                 token_budget: int = 8192, batch_size: int | None = None,
                 chunk_size: int = 64, greedy: bool = True,
                 mc_log: str | os.PathLike | None = None, progress: bool = False,
                 **loading: Any) -> None:
        super().__init__()
        unknown = sorted(set(loading) - set(_LOADING))
        if unknown:
            raise TypeError(
                f"mptlml model_args: unknown {unknown}. Loading takes pretrained, device, "
                f"{', '.join(_LOADING)}; scoring takes {', '.join(_SETTINGS)}.")
        if pretrained is None:
            raise ValueError("mptlml model_args need pretrained=DIR_OR_HUB_ID (a masked LM, or "
                             "a masked-diffusion LM with mask_token_id=...).")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"model_args seed must be an int, got {seed!r}.")
        if num_masks is not None and target_se is not None:
            raise ValueError("pass num_masks or target_se, not both (target_se draws masks "
                             "until each request's standard error is about its value).")
        self.greedy = _flag(greedy, "greedy")
        self.decide = _flag(decide, "decide")
        self.progress = _flag(progress, "progress")
        self.estimator = str(estimator)
        self.num_masks = num_masks
        self.target_se = target_se
        self.max_masks = max_masks
        self.seed = int(seed)
        self.token_budget = int(token_budget)
        self.batch_size = batch_size
        self.chunk_size = int(chunk_size)
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
            lm = MaskedLM.from_pretrained(pretrained, device=dev, **loading)
        self.model = lm
        self._rank, self._world_size = self._ctx.rank, self._ctx.world
        self._device = lm.device
        path = mc_log
        if path is None and self.default_mc_dir is not None:
            stamp = datetime.now().isoformat().replace(":", "-")
            path = Path(self.default_mc_dir) / f"mptlml_monte_carlo_{stamp}.jsonl"
        self.log = RecordLog(path, write=self._ctx.main)
        self._questions = 0
        self._announced_greedy = False

    # ------------------------------------------------------------------ lm-eval plumbing
    @classmethod
    def create_from_arg_string(cls, arg_string: str,
                               additional_config: dict | None = None) -> MPTLM:
        """``--model_args k=v,...`` plus lm-eval's ``--device`` / ``--batch_size``."""
        from lm_eval.utils import simple_parse_args_string

        return cls._create(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> MPTLM:
        """``model_args`` as a dict, plus lm-eval's ``device`` / ``batch_size``."""
        return cls._create(dict(arg_dict), additional_config)

    @classmethod
    def _create(cls, args: dict[str, Any], additional: dict | None) -> MPTLM:
        extra = {k: v for k, v in (additional or {}).items() if v is not None}
        device = extra.pop("device", None)
        if device is not None:
            if args.get("device") not in (None, device):
                raise ValueError(f"--device {device} and model_args device={args['device']} "
                                 "disagree; give one.")
            args.setdefault("device", device)
        harness = {k: extra.pop(k) for k in ("batch_size", "max_batch_size") if k in extra}
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

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        parts = gather(obj, self._ctx)
        return parts if self.rank == dst else None

    def barrier(self) -> None:
        if self.world_size > 1:
            from ..estimation.distributed import barrier

            barrier(self._ctx)

    def get_model_info(self) -> dict[str, Any]:
        """The model, the settings and the run's Monte Carlo summary (into lm-eval's results).

        lm-eval calls this once, after all requests, on the main process.
        """
        summary = self.log.close_run()
        for line in summary_lines(summary):
            logger.info("Monte Carlo: %s", line)
        for task, s in summary.items():
            if s.get("undecided"):
                logger.warning(
                    "%s: %d of %d multiple-choice decisions are within 2 paired standard "
                    "errors (Monte Carlo noise can move its accuracy by up to %.3g); more masks "
                    "(num_masks, or decide=true with a larger max_masks) decide them.",
                    task, s["undecided"], s["questions"], s["undecided_share"])
        return {"mptlml": {
            "model": self.model.name, **self.model.settings(),
            "estimator": self.estimator, "num_masks": self._num_masks(),
            "target_se": self.target_se, "max_masks": self.max_masks, "decide": self.decide,
            "seed": self.seed, "token_budget": self.token_budget, "greedy": self.greedy,
            "world_size": self.world_size,
            "mc_log": None if self.log.path is None else str(self.log.path),
            "monte_carlo": summary}}

    # ------------------------------------------------------------------ requests
    def _everyone(self, keys: list[_Key]) -> list[_Key]:
        """Every process's requests, without repeats, in one canonical order."""
        allk = [k for part in gather(keys, self._ctx) for k in part]
        return sorted(set(allk))

    def _num_masks(self) -> int | None:
        if self.target_se is not None:
            return self.num_masks
        return DEFAULT_NUM_MASKS if self.num_masks is None else self.num_masks

    def _mc(self) -> dict[str, Any]:
        """The Monte Carlo arguments of an mptlml call."""
        kw: dict[str, Any] = {"seed": self.seed}
        if self.target_se is not None:
            kw["target_se"] = self.target_se
            if self.num_masks is not None:
                kw["num_masks"] = self.num_masks
        else:
            kw["num_masks"] = self._num_masks()
        if self.max_masks is not None:
            kw["max_masks"] = self.max_masks
        return kw

    def _run(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"token_budget": self.token_budget, "chunk_size": self.chunk_size,
                              "progress": self.progress}
        if self.batch_size is not None:
            kw["batch_size"] = self.batch_size
        return kw

    def _estimate(self, targets: list[torch.Tensor], contexts: list[torch.Tensor]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The MPT bound, its SE and its masked inputs for each (context, target) of ids."""
        if not targets:
            return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
        kw = {**self._mc(), **self._run()}
        if self.target_se is not None:
            # estimate_lml aims at the SE of the mean over the sequences, sqrt(sum se_i^2) / N:
            # at target / sqrt(N) the root mean square of the sequences' SEs is the target
            kw["target_se"] = self.target_se / math.sqrt(len(targets))
        if any(len(c) for c in contexts):
            kw["context"] = [c.tolist() for c in contexts]
        est = mptlml.estimate_lml(self.model, [t.tolist() for t in targets], self.estimator,
                                  **kw)
        rows = est.num_masked_rows_per_sample
        return (est.per_sample.numpy(), est.per_sample_stderr.numpy(),
                np.asarray(rows if rows is not None else
                           [est.num_masked_rows // len(targets)] * len(targets)))

    # ---------------------------------------------------------------- loglikelihood
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False
                      ) -> list[tuple[float, bool]]:
        """log p(continuation | context) and is_greedy for each (context, continuation)."""
        keys = [_key(r) for r in requests]
        if not keys and self.world_size == 1:
            return []
        everyone = self._everyone(keys)
        records = self._score_pairs(everyone)
        self.log.add([records[k] for k in everyone])
        return [(float(records[k]["loglikelihood"]), bool(records[k]["is_greedy"]))
                for k in keys]

    def _pair_ids(self, keys: list[_Key]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Context and continuation ids of each pair: the joined text, tokenised by the model."""
        ids, nctx = encode_with_context(_Unbounded(self.model), [k.args[0] for k in keys],
                                        [k.args[1] for k in keys])
        return [t[:n] for t, n in zip(ids, nctx, strict=True)], [
            t[n:] for t, n in zip(ids, nctx, strict=True)]

    def _score_pairs(self, keys: list[_Key]) -> dict[_Key, dict[str, Any]]:
        ctx_ids, cont_ids = self._pair_ids(keys)
        limit = self.model.max_content_length
        groups: dict[tuple[str, int, str], list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            groups[(k.task, k.doc_id, k.args[0])].append(i)
        records: dict[_Key, dict[str, Any]] = {}
        lone: list[int] = []
        questions: list[list[int]] = []
        kept: dict[int, torch.Tensor] = {}
        for members in groups.values():
            longest = max(len(cont_ids[i]) for i in members)
            if longest > limit:
                k = keys[members[0]]
                raise ValueError(
                    f"task {k.task!r}, document {k.doc_id}: a continuation of {longest} tokens "
                    f"is longer than the model's {limit} content tokens; mptlml cannot score it "
                    "given its context (loglikelihood_rolling windows long texts).")
            room = limit - longest
            for i in members:
                c = ctx_ids[i]
                kept[i] = c[len(c) - room:] if len(c) > room else c
            (questions if len(members) > 1 else lone).append(members)
        for members in questions:
            self._questions += 1
            self._score_question(keys, members, kept, cont_ids, self._questions, records)
        flat = [m[0] for m in lone]
        ll, se, rows = self._estimate([cont_ids[i] for i in flat], [kept[i] for i in flat])
        for j, i in enumerate(flat):
            records[keys[i]] = self._record(keys[i], ll[j], se[j], rows[j], cont_ids[i],
                                            kept[i], ctx_ids[i])
        greedy = self._greedy(keys, kept, cont_ids)
        for k, g in zip(keys, greedy, strict=True):
            records[k]["is_greedy"] = g
        return records

    def _score_question(self, keys: list[_Key], members: list[int], kept: dict[int, Any],
                        cont_ids: list[torch.Tensor], qid: int,
                        records: dict[_Key, dict[str, Any]]) -> None:
        raise NotImplementedError  # replaced once mptlml.compare is merged

    def _record(self, key: _Key, ll: float, se: float, rows: int, cont: torch.Tensor,
                kept: torch.Tensor, ctx: torch.Tensor) -> dict[str, Any]:
        return {"request": "loglikelihood", "task": key.task, "doc_id": key.doc_id,
                "idx": key.idx, "loglikelihood": float(ll), "stderr": float(se),
                "masked_inputs": int(rows), "num_tokens": len(cont),
                "context_tokens": len(kept), "context_tokens_dropped": len(ctx) - len(kept)}

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
        keys = [_key(r) for r in requests]
        if not keys and self.world_size == 1:
            return []
        everyone = self._everyone(keys)
        ids = _Unbounded(self.model).encode([k.args[0] for k in everyone]) if everyone else []
        limit = self.model.max_content_length
        spans = [_windows(len(t), limit) for t in ids]
        targets = [t[s:e] for t, sp in zip(ids, spans, strict=True) for _, s, e in sp]
        contexts = [t[c:s] for t, sp in zip(ids, spans, strict=True) for c, s, _ in sp]
        ll, se, rows = self._estimate(targets, contexts)
        records: dict[_Key, dict[str, Any]] = {}
        w = 0
        for k, t, sp in zip(everyone, ids, spans, strict=True):
            n = len(sp)
            text = k.args[0]
            records[k] = {
                "request": "loglikelihood_rolling", "task": k.task, "doc_id": k.doc_id,
                "idx": k.idx, "loglikelihood": float(ll[w:w + n].sum()),
                "stderr": float(math.sqrt((se[w:w + n] ** 2).sum())),
                "masked_inputs": int(rows[w:w + n].sum()), "num_tokens": len(t), "windows": n,
                "words": len(re.split(r"\s+", text)), "bytes": len(text.encode("utf-8"))}
            w += n
        self.log.add([records[k] for k in everyone])
        return [records[k]["loglikelihood"] for k in keys]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        raise NotImplementedError(
            "mptlml scores text and does not generate: it answers loglikelihood "
            "(multiple-choice) and loglikelihood_rolling (perplexity) tasks. Run generation "
            "tasks (generate_until, e.g. gsm8k) with a model that generates, such as lm-eval's "
            "'hf' backend or a masked-diffusion LM's own sampler.")


def _windows(n: int, limit: int) -> list[tuple[int, int, int]]:
    """(context start, start, end) of the windows of a text of n tokens, at most ``limit`` each.

    One window when the text fits; else the first ``limit`` tokens, then windows of
    ``limit - limit // 2`` tokens, each given the ``limit - its length`` tokens before it.
    An empty text has no window.
    """
    if n <= limit:
        return [(0, 0, n)] if n else []
    out = [(0, 0, limit)]
    step = limit - limit // 2
    start = limit
    while start < n:
        end = min(start + step, n)
        out.append((max(0, start - (limit - (end - start))), start, end))
        start = end
    return out
