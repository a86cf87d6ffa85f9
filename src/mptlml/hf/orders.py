"""Sampling a masked LM by unmasking in a random order.

For a uniformly random order pi of the D positions, the chain rule

    log q_pi(x) = sum_{t=1..D} log q(x_pi(t) | x_pi(t+1..D))

scores at step t the position pi(t) with the first t positions of pi masked.
Its expectation over pi is the MPT sum ``sum_M S(x; M)`` (see
:mod:`mptlml.hf`): ``mptlml.estimate_lml(mlm, seqs, "chain-rule")``
(:mod:`mptlml.estimators.chain_rule`) and the cumulative estimator estimate
the same lower bound on the order mixture's log-likelihood, with different
noise. :func:`sample_random_order` draws from q_pi for a random pi: all
positions masked, then one position at a time, in a random order, drawn from
the model's conditional given the positions already drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validation import check_positive_int, make_generator
from ..masks import random_orders
from ..models.masked_lm import MaskedLM
from ..models.sequence_input import as_token_ids

__all__ = ["sample_random_order"]


@torch.no_grad()
def sample_random_order(mlm: MaskedLM, num_samples: int, length: int, *,
                        allowed_ids: Sequence[int] | None = None,
                        generator: torch.Generator | int | None = None) -> torch.Tensor:
    """Draw ``(num_samples, length)`` content ids by unmasking in a uniformly random order.

    Parameters
    ----------
    mlm : MaskedLM
        Its special frame ([CLS] ... [SEP]) and mask token are used.
    num_samples, length : int
    allowed_ids : sequence of int, optional
        Tokens a position may take (the conditional is renormalised over
        them); default every non-special token.
    generator : torch.Generator or int, optional

    Returns
    -------
    LongTensor ``(num_samples, length)``
    """
    n = check_positive_int(num_samples, "num_samples")
    d = check_positive_int(length, "length")
    if d > mlm.max_content_length:
        raise ValueError(f"length {d} exceeds the model's maximum of {mlm.max_content_length}.")
    g = make_generator(generator)
    specials = set(mlm.special_ids)
    allowed = (torch.unique(as_token_ids(list(allowed_ids), "allowed_ids",
                                             "pass integer vocabulary ids"))
               if allowed_ids is not None else
               torch.tensor([i for i in range(mlm.vocab_size) if i not in specials],
                            dtype=torch.long))
    if allowed.numel() == 0 or int(allowed.min()) < 0 or int(allowed.max()) >= mlm.vocab_size:
        raise ValueError(f"allowed_ids must be non-empty ids in [0, {mlm.vocab_size}).")
    model, dev = mlm.model, mlm.device
    x = torch.full((n, d), mlm.mask_token_id, dtype=torch.long)
    pre = torch.tensor(mlm.prefix, dtype=torch.long).expand(n, -1)
    suf = torch.tensor(mlm.suffix, dtype=torch.long).expand(n, -1)
    orders = random_orders(d, 1, num_data=n, generator=g)[0]  # (n, d)
    rows, off = torch.arange(n), len(mlm.prefix)
    for t in range(d):
        j = orders[:, t]
        logits = model(input_ids=torch.cat([pre, x, suf], 1).to(dev)).logits
        probs = torch.softmax(logits[rows, j + off][:, allowed.to(dev)].float(), -1).cpu()
        x[rows, j] = allowed[torch.multinomial(probs, 1, generator=g)[:, 0]]
    return x
