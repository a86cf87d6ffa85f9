"""Random orders of a masked LM: the chain-rule LML bound and sampling by unmasking.

For a uniformly random order pi of the D positions, the chain rule

    log q_pi(x) = sum_{t=1..D} log q(x_pi(t) | x_pi(t+1..D))

scores at step t the position pi(t) with the first t positions of pi masked.
Its expectation over pi is the MPT sum ``sum_M S(x; M)`` (see
:mod:`mptlml.hf`), so :func:`chain_rule_lml` and the cumulative estimator of
:func:`mptlml.estimate_lml` estimate the same lower bound on the order
mixture's log-likelihood, with different noise. :func:`sample_random_order`
draws from q_pi for a random pi: all positions masked, then one position at a
time, in a random order, drawn from the model's conditional given the
positions already drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .._validation import check_positive_int, make_generator
from ..masks import prefix_masks, random_orders
from ..models.masked_lm import MaskedLM

__all__ = ["chain_rule_lml", "sample_random_order"]


def chain_rule_lml(mlm: MaskedLM, ids: torch.Tensor, num_orders: int = 1, seed: int = 0, *,
                   token_budget: int = 16384) -> np.ndarray:
    """``(N,)`` mean over random orders of ``sum_t log q(x_pi(t) | x_pi(t+1..D))``.

    Parameters
    ----------
    mlm : MaskedLM
    ids : LongTensor ``(N, D)``
        Content token ids (no special tokens) of equal-length sequences.
    num_orders : int
        Independent uniformly random orders per sequence (``random_orders``).
    seed : int
        Seed of the orders.
    token_budget : int
        Padded tokens per forward pass (``MaskedLM.score_positions``).

    Returns
    -------
    numpy.ndarray ``(N,)``, float64: D forward rows per order and sequence.
    """
    if not isinstance(mlm, MaskedLM):
        raise TypeError(f"mlm must be a mptlml.models.MaskedLM, got {type(mlm).__name__}.")
    ids = torch.as_tensor(ids).long()
    if ids.ndim != 2 or ids.shape[1] < 1:
        raise ValueError(f"ids must be a (N, D) tensor of content ids, got {tuple(ids.shape)}.")
    p = check_positive_int(num_orders, "num_orders")
    mlm.encode(ids)  # validates the ids (no specials, in the vocabulary, not too long)
    n, d = ids.shape
    orders = random_orders(d, p, num_data=n, generator=seed)  # (P, N, D)
    masks = prefix_masks(orders)  # (P, D, N, D): [q, t-1, i] = first t positions of order q
    off = len(mlm.prefix)
    inputs, pos, tgt = [], [], []
    for i in range(n):
        for q in range(p):
            x = mlm.corrupt(ids[i], masks[q, :, i])  # (D, T): row t-1 masks the first t
            scored = orders[q, i]
            for t in range(d):
                inputs.append(x[t])
                pos.append(scored[t:t + 1] + off)
                tgt.append(ids[i, scored[t:t + 1]])
    lp = mlm.score_positions(inputs, pos, tgt, token_budget=token_budget)
    return torch.cat(lp).view(n, p, d).sum(2).mean(1).numpy()


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
    allowed = torch.tensor(sorted(set(allowed_ids)) if allowed_ids is not None else
                           [i for i in range(mlm.vocab_size) if i not in specials],
                           dtype=torch.long)
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
