"""The ``--model_args`` of mptlml's lm-eval models, checked before anything loads.

:func:`read_model_args` turns a model's ``model_args`` (mptlml's own, LLaDA's and
Dream's through :func:`~mptlml.lm_eval.peers.translate`) and lm-eval's ``--device`` /
``--batch_size`` into :class:`RunSettings` (how requests are scored) and the loading
options of :meth:`~mptlml.models.MaskedLM.from_pretrained`; every name and value is
checked here, and a refusal names the argument as the user spelt it.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._scoring.distributed import distributed_context, launched, resolve_device
from .._validation import MONTE_CARLO_OPTIONS, SEED_INT, check_options, check_positive_int
from ..estimators.api import available
from ..estimators.compare import EXACT_LENGTH, compare
from ..estimators.llada import LLaDA
from .generation import GenerationSettings, generation_settings
from .peers import MODEL_DEFAULTS, PEER_ARGUMENTS, translate
from .records import check_log_path

__all__ = ["DEFAULT_ESTIMATOR", "LOADING", "SETTINGS", "RunSettings", "check_arg_names",
           "harness_device", "load_model", "read_model_args", "with_harness"]

logger = logging.getLogger("lm_eval.mptlml")

#: compare's draw unless ``estimator`` says (the rate draw)
DEFAULT_ESTIMATOR = str(inspect.signature(compare).parameters["estimator"].default)
#: LLaDA's defaults for ``estimator=llada``: masked inputs per request, masks per batch
LLADA_MC_NUM, LLADA_BATCH = 128, 32
#: mptlml.compare's first round when ``mc_num`` does not set it
_COMPARE_NUM_MASKS = int(inspect.signature(compare).parameters["num_masks"].default)
#: loading options passed to ``MaskedLM.from_pretrained`` (transformers' among them)
LOADING = ("tokenizer", "mask_token_id", "trust_remote_code", "dtype", "add_special_tokens",
           "revision", "autocast", "attn_implementation", "local_files_only", "cache_dir",
           "corruption", "allow_unknown")
#: the loading options of ``pretrained=antiberty`` (MaskedLM.antiberty)
ANTIBERTY = ("dtype", "autocast", "corruption", "allow_unknown")
#: settings of the Monte Carlo estimate and of the run (the fields of RunSettings)
SETTINGS = ("estimator", "num_masks", "target_se", "max_masks", "mc_num", "batch", "decide",
            "seed", "token_budget", "batch_size", "max_length", "greedy", "cfg", "mc_log",
            "progress", "add_bos_token")
#: the settings that are numbers or flags: a string value is read by lm-eval's own rule
#: (``lm_eval.utils.handle_arg_string``: "true" -> True, "8" -> 8, "0.1" -> 0.1)
VALUED = ("num_masks", "target_se", "max_masks", "mc_num", "batch", "decide", "seed",
          "token_budget", "batch_size", "max_length", "greedy", "cfg", "progress",
          "add_bos_token")
#: the Monte Carlo options, checked by the one table (mptlml._validation.MONTE_CARLO_OPTIONS);
#: here num_masks may be left out (compare's default) and a seed is an int
_OVERRIDES = {"num_masks": [*MONTE_CARLO_OPTIONS["num_masks"], None], "seed": [SEED_INT]}


@dataclass(frozen=True)
class RunSettings:
    """How a run scores its requests (``--model_args`` past the loading options).

    Attributes
    ----------
    estimator : str
        Whose draws score the requests: :func:`mptlml.compare`'s ``estimator``, a ragged
        estimator's name (``"learned-rate"``, the default: the candidates of a question on
        common masks; ``"cumulative"``, ...), or ``"llada"``: LLaDA's own scheme,
        ``compare(estimator=LLaDA(mc_num, batch=batch), num_masks=mc_num,
        common_masks=False)`` (``mc_num`` masks per request, default
        128, counts systematic per batch of ``batch``, default 32; each candidate its own
        masks): reproduce a published LLaDA number first, then switch.
    num_masks : int, optional
        Masks per request in the first round (even; compare's default when None).
    target_se : float, optional
        Keep drawing rounds until every request's standard error is at most this (nats).
    max_masks : int, optional
        Most masked inputs per request (candidate), all rounds together: compare's
        ``max_masks`` (alone: a fixed budget spent whole).
    mc_num : int, optional
        LLaDA's and Dream's name: a fixed budget of N masked inputs per request
        (``max_masks`` alone; the rate draw spends an even N as N - 1, 1 or 2 as 3,
        announced); with ``estimator=llada`` LLaDA's ``mc_num``.
    batch : int, optional
        ``estimator=llada``: LLaDA's masks per batch (lm-eval's ``--batch_size``, as in
        LLaDA's adapter).
    decide : bool
        Multiple choice: draw rounds until the leader is decided (compare's rule).
    seed : int
        Seed of every mask; a request's masks come from it and the request's own texts.
    token_budget, batch_size : int
        Padded tokens per forward pass; at most this many inputs per forward pass.
    max_length : int, optional
        Most tokens of one scored input, special tokens included (contexts cut on the left).
    greedy : bool
        Compute ``is_greedy`` by greedy unmasking (LLaDA's ``is_check_greedy``).
    cfg : float
        Classifier-free guidance w (LLaDA's ``cfg``; Dream's ``classifier_free_guidance``
        is w + 1); 0: none. Refused where it cannot apply (with the greedy check; on a
        request without a context; on a perplexity task).
    mc_log : path, optional
        The JSON-lines file of per-request records (:mod:`mptlml.lm_eval.records`),
        created when the model is built.
    progress : bool
        Progress bars of the scoring.
    add_bos_token : bool
        Dream's: the tokenizer's BOS token before every scored input's context.
    generation : GenerationSettings
        ``generate_until``'s sampler settings (LLaDA's ``gen_length``, ``steps``,
        ``block_length``, ...; :func:`~mptlml.lm_eval.generation.generation_settings`).
    spelt : dict
        mptlml's name -> the name the user passed (LLaDA's and Dream's), for messages.
    """

    estimator: str = DEFAULT_ESTIMATOR
    num_masks: int | None = None
    target_se: float | None = None
    max_masks: int | None = None
    mc_num: int | None = None
    batch: int | None = None
    decide: bool = False
    seed: int = 0
    token_budget: int = 8192
    batch_size: int | None = None
    max_length: int | None = None
    greedy: bool = True
    cfg: float = 0.0
    mc_log: str | None = None
    progress: bool = False
    add_bos_token: bool = False
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    spelt: dict[str, str] = field(default_factory=dict, compare=False)

    def name(self, ours: str) -> str:
        """The argument as the user spelt it (``is_check_greedy`` for ``greedy``)."""
        return self.spelt.get(ours, ours)

    def compare_options(self) -> dict[str, Any]:
        """:func:`mptlml.compare`'s keywords for these settings (all but the seeds)."""
        kw: dict[str, Any] = {"token_budget": self.token_budget, "progress": self.progress,
                              "cfg_scale": self.cfg, "batch_size": self.batch_size}
        if self.estimator == LLaDA.name:  # LLaDA's scheme: its draws, each candidate's own
            return {**kw, "estimator": LLaDA(self.mc_num, batch=self.batch),
                    "num_masks": self.mc_num, "common_masks": False}
        kw.update(decide=self.decide, estimator=self.estimator)
        for name in ("num_masks", "target_se", "max_masks"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return kw

    def config(self) -> dict[str, Any]:
        """The settings for lm-eval's results' config."""
        return {k: v for k, v in asdict(self).items() if k not in ("spelt", "mc_log")}


def _flag(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    raise TypeError(f"model_args {name} must be true or false, got {value!r}.")


def _refuse_unknown(loading: dict[str, Any]) -> None:
    """Refuse the names of ``loading`` that are no loading option."""
    unknown = sorted(set(loading) - set(LOADING))
    if unknown:
        raise TypeError(
            f"mptlml model_args: unknown {unknown}. Loading takes pretrained, device, "
            f"{', '.join(LOADING)}; scoring takes {', '.join(SETTINGS)}; LLaDA's and "
            f"Dream's {', '.join(PEER_ARGUMENTS)} are taken too.")


def check_arg_names(args: dict[str, Any]) -> None:
    """Refuse a model_args name the models refuse, without loading anything (the command
    line calls it before lm-eval indexes its tasks)."""
    args = dict(args)
    generation_settings(args)  # takes the generation options out, checked
    rest, _ = translate({k: v for k, v in args.items()
                         if k not in (*SETTINGS, "pretrained", "device")})
    _refuse_unknown({k: v for k, v in rest.items() if k not in (*SETTINGS, "pretrained")})


def _budget(mc_num: int, num_masks: int | None, max_masks: int | None) -> tuple[int, int]:
    """LLaDA's / Dream's ``mc_num`` as :func:`mptlml.compare`'s ``(num_masks, max_masks)``.

    ``mc_num`` masked inputs per request (``max_masks``: the whole continuation's row and
    ``mc_num - 1`` draws, in pairs), the first round of ``min(num_masks, draws)``; at
    least 3 (one pair and the whole continuation), announced.
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


def _first_round_fits(num_masks: int | None, max_masks: int | None) -> None:
    """The rate draw's first round and the whole continuation's row fit in ``max_masks``."""
    first = _COMPARE_NUM_MASKS if num_masks is None else num_masks
    if max_masks is not None and max_masks < first + 1:
        given = "" if num_masks is not None else ", mptlml.compare's default"
        lower = (f", or pass model_args num_masks=N (even, at most {(max_masks - 1) // 2 * 2})"
                 if max_masks >= 3 else "")
        raise ValueError(f"model_args max_masks={max_masks} (masked inputs per request) is "
                         f"below the first round's num_masks={first}{given} draws and the "
                         f"whole continuation's row: raise max_masks to at least {first + 1}"
                         f"{lower}.")


def _llada(s: dict[str, Any], spelt: dict[str, str]) -> dict[str, Any]:
    """``estimator=llada``'s settings: LLaDA's defaults; compare's own options refused."""
    given = [spelt.get(k, k) for k in ("num_masks", "target_se", "max_masks", "decide")
             if s.get(k)]
    if given:
        raise ValueError(f"model_args {given} are mptlml's rate draw's; estimator=llada draws "
                         "mc_num masks per request in batches of batch, as LLaDA does. Drop "
                         "them, or leave estimator out.")
    mc_num = LLADA_MC_NUM if s.get("mc_num") is None else s["mc_num"]
    batch = LLADA_BATCH if s.get("batch") is None else check_positive_int(s["batch"],
                                                                          "model_args batch")
    if mc_num % batch or mc_num // batch < 2:
        raise ValueError(f"model_args {spelt.get('mc_num', 'mc_num')}={mc_num} is not two or "
                         f"more whole batches of batch={batch} (LLaDA's masks per batch; its "
                         "standard error is the spread of the batch means); pass a multiple "
                         f"of {batch}, at least {2 * batch}.")
    return {**s, "mc_num": mc_num, "batch": batch}


def read_model_args(args: dict[str, Any], *, model: str = "mptlml"
                    ) -> tuple[RunSettings, dict[str, Any]]:
    """``model_args`` as :class:`RunSettings` and the loading options (``pretrained``,
    ``device`` and :data:`LOADING`), every name and value checked.

    ``model`` (``llada_dist``, ``dream``) adds its adapter's defaults
    (:data:`~mptlml.lm_eval.peers.MODEL_DEFAULTS`; remote code only where a checkpoint is
    loaded).
    """
    args = dict(args)
    generation = generation_settings(args)  # generate_until's, taken out and checked
    merged, spelt = translate(args)
    defaults = {k: v for k, v in MODEL_DEFAULTS.get(model, {}).items() if k not in merged
                and (k in SETTINGS or isinstance(merged.get("pretrained"), str | os.PathLike))}
    merged = {**defaults, **merged}
    s = {k: merged.pop(k) for k in SETTINGS if k in merged}
    loading = merged
    _refuse_unknown({k: v for k, v in loading.items() if k not in ("pretrained", "device")})
    if loading.get("pretrained") is None:
        raise ValueError("mptlml model_args need pretrained=DIR_OR_HUB_ID (a masked LM, or a "
                         "masked-diffusion LM with mask_token_id=...).")
    estimator = s.get("estimator", DEFAULT_ESTIMATOR)
    if estimator not in available(ragged=True):
        raise ValueError(f"model_args estimator={estimator!r}: pass one of "
                         f"{', '.join(available(ragged=True))} (mptlml.compare's estimators; "
                         f"{LLaDA.name!r}: LLaDA's own scheme, to reproduce its numbers).")
    check_options("mptlml model_args", overrides=_OVERRIDES, **{
        k: s[k] for k in ("num_masks", "target_se", "max_masks", "decide", "seed",
                          "token_budget", "batch_size", "progress") if k in s})
    for name in ("mc_num", "max_length"):
        if s.get(name) is not None:
            check_positive_int(s[name], f"model_args {spelt.get(name, name)}")
    for name in ("greedy", "add_bos_token"):
        if name in s:
            s[name] = _flag(s[name], f"{spelt.get(name, name)}")
    if s.get("num_masks") is not None and s["num_masks"] % 2 and estimator == DEFAULT_ESTIMATOR:
        raise ValueError(f"model_args num_masks must be even (mptlml.compare draws two masks "
                         f"per rate stratum), got {s['num_masks']}.")
    if estimator == LLaDA.name:
        s = _llada(s, spelt)
    else:
        if s.get("batch") is not None:
            raise ValueError(f"model_args batch={s['batch']} is LLaDA's masks per batch, of "
                             "estimator=llada only; drop it, or pass estimator=llada.")
        if s.get("mc_num") is not None:
            s["num_masks"], s["max_masks"] = _budget(s["mc_num"], s.get("num_masks"),
                                                     s.get("max_masks"))
        _first_round_fits(s.get("num_masks"), s.get("max_masks"))
    s["cfg"] = float(s.get("cfg", 0.0))
    if s["cfg"] and s.get("greedy", True):
        cfg = spelt.get("cfg", "cfg")
        raise ValueError(f"model_args {cfg}={args.get(cfg, s['cfg'])!r} with the greedy check: "
                         "is_greedy would be computed without guidance. Pass "
                         f"{spelt.get('greedy', 'is_check_greedy')}=false (as LLaDA's guided "
                         "runs do) or cfg=0.")
    if s.get("mc_log") is not None:
        check_log_path(Path(s["mc_log"]))  # before the model is loaded
        s["mc_log"] = os.fspath(s["mc_log"])
    return RunSettings(**s, generation=generation, spelt=spelt), loading


def harness_device(device: str) -> str:
    """lm-eval's ``--device`` (default ``cuda:0``) as the device this process scores on: a
    CUDA device is each process's own GPU under a launcher, the CPU where there is none."""
    if not device.startswith("cuda"):
        return device
    if not torch.cuda.is_available():
        logger.info("lm-eval's --device %s (its default is cuda:0): CUDA is not available "
                    "here; scoring on the CPU.", device)
        return "cpu"
    return "cuda" if launched() else device


def with_harness(args: dict[str, Any], additional: dict | None, model: str) -> dict[str, Any]:
    """``model_args`` plus lm-eval's ``--device`` and ``--batch_size`` (``additional``).

    ``--device`` places the model unless ``model_args device=`` does; ``--batch_size`` (and
    ``model_args batch_size`` of ``llada_dist`` / ``dream``) is LLaDA's and Dream's masks per
    batch: ``batch`` of ``estimator=llada``, announced as not applying otherwise.
    """
    args = dict(args)
    extra = {k: v for k, v in (additional or {}).items() if v is not None}
    device = extra.pop("device", None)
    if device is not None and args.get("device") is None:
        args["device"] = harness_device(str(device))
    harness = {k: extra.pop(k) for k in ("batch_size", "max_batch_size") if k in extra}
    if extra:
        raise TypeError(f"mptlml does not take lm-eval's {sorted(extra)}.")
    if str(harness.get("max_batch_size", 1)) not in ("1", "auto"):
        warnings.warn(f"lm-eval's --max_batch_size {harness['max_batch_size']} does not apply "
                      "to mptlml: it batches masked inputs by token_budget (model_args "
                      "token_budget=N).", UserWarning, stacklevel=4)
    size = args.pop("batch_size", None) if model in MODEL_DEFAULTS else None
    size = harness.get("batch_size") if size is None else size
    if size is None or str(size) == "auto":
        return args
    if args.get("estimator") == "llada":
        args.setdefault("batch", int(size))
    elif int(size) != 1:
        warnings.warn(f"batch_size={size} (LLaDA's and Dream's masks per batch, estimator="
                      "llada's batch) does not apply to mptlml's rate draw: it batches masked "
                      "inputs by token_budget (model_args token_budget=N, or batch_size=N "
                      "inputs per forward pass).", UserWarning, stacklevel=4)
    return args


def load_model(loading: dict[str, Any], device: str | None) -> tuple[Any, Any]:
    """The model of ``loading`` (``pretrained`` and :data:`LOADING`) on ``device``, and the
    process group (made first: under a launcher each rank takes its own device).

    ``pretrained`` is a :class:`~mptlml.models.MaskedLM` (then no loading option applies),
    ``"antiberty"`` (:meth:`~mptlml.models.MaskedLM.antiberty`, taking :data:`ANTIBERTY`), or
    a directory or hub id (:meth:`~mptlml.models.MaskedLM.from_pretrained`).
    """
    from ..models import MaskedLM

    loading = dict(loading)
    pretrained = loading.pop("pretrained")
    if isinstance(pretrained, MaskedLM):
        if loading:
            raise TypeError(f"{sorted(loading)} apply when loading a model; pretrained is a "
                            "MaskedLM already.")
        lm = pretrained if device is None else pretrained.to(resolve_device(device))
        return lm, distributed_context(cpu=lm.device.type == "cpu")
    dev = resolve_device(device)
    ctx = distributed_context(cpu=dev.type == "cpu")
    if str(pretrained).lower() == "antiberty":  # as `mptlml curve --model antiberty`
        other = sorted(set(loading) - set(ANTIBERTY) - {"trust_remote_code"})
        if other:
            raise TypeError(f"model_args {other} do not apply to pretrained=antiberty (bundled, "
                            f"with its own tokenizer); it takes {', '.join(ANTIBERTY)}.")
        return MaskedLM.antiberty(device=dev, **{k: v for k, v in loading.items()
                                                 if k in ANTIBERTY}), ctx
    return MaskedLM.from_pretrained(pretrained, device=dev, **loading), ctx
