"""mptlml as an lm-evaluation-harness backend: benchmarks for masked LMs and masked-diffusion LMs.

Importing this package registers the lm-eval model ``mptlml``
(:class:`~mptlml.lm_eval.backend.MPTLM`), so that lm-eval's own evaluator runs
on any masked LM (``AutoModelForMaskedLM``) or masked-diffusion LM
(``MaskedLM.from_pretrained(..., mask_token_id=...)``)::

    import lm_eval
    import mptlml.lm_eval  # registers "mptlml"

    results = lm_eval.simple_evaluate(
        model="mptlml", model_args="pretrained=DIR,num_masks=4,seed=0", tasks=["piqa"])

and ``python -m mptlml.lm_eval --model mptlml --model_args ... --tasks ...``
(lm-eval's own command line, the model registered first; :func:`main`).
``add_monte_carlo_stderr(results)`` puts each metric's Monte Carlo standard error
beside lm-eval's in a ``simple_evaluate`` result (the command line does it itself).

The requests are answered with the masked pre-training (MPT) bound of the
log-likelihood (Moreno-Munoz, Recasens & Hauberg, NeurIPS 2023, Prop. 1, and
its conditional form; an equality for a consistent model)::

    log p(x_T | x_C) >= sum_{M=1..|T|} S_T(x; M),
    S_T(x; M) = E_{mask in T, |mask| = M}[(1/M) sum_{j in mask} log p(x_j | x_rest)]

``loglikelihood`` scores a continuation T given its context C (the candidates of
one document on common masks), ``loglikelihood_rolling`` a whole text (the bound
with no context), both through :func:`mptlml.compare`; every request's Monte
Carlo standard error and cost go to a JSON-lines file beside lm-eval's output
(:mod:`mptlml.lm_eval.records`), and the run's summary into lm-eval's results.

lm-eval is an optional dependency: ``pip install "mptlml[lm-eval]"`` (importing this
package without it raises ``ModuleNotFoundError`` naming the extra).
"""

from __future__ import annotations

from .backend import MPTLM
from .command import main
from .records import add_monte_carlo_stderr, summarize

__all__ = ["MPTLM", "add_monte_carlo_stderr", "main", "summarize"]
