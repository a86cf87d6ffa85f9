"""The random-size estimator: D * S_hat(x; M) with one size M ~ U{1..D} per draw.

Proposition 1 of Moreno-Munoz, Recasens & Hauberg (NeurIPS 2023) writes
log p(x) as a sum of D terms; drawing one term uniformly and multiplying by D
gives an unbiased estimate with one mask of work::

    E_{M ~ U{1..D}} [ D * S_hat(x; M) ] = sum_{M=1..D} S(x; M) = log p(x).

More generally, for any size distribution q with q(M) > 0 on 1..D,
``S_hat(x; M) / q(M)`` with M ~ q is unbiased (importance sampling of the
size). Subclasses change :meth:`RandomSize.size_probs`; the weights follow.
On ragged sequences (a masked LM) each draw of sequence i takes its own size
M ~ U{1..D_i} and weight D_i / M: the any-order autoregressive /
masked-diffusion bound whose 1/t weight is D/M (see ``docs/notes.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.ragged import run_pairs, seq_seed
from .._validation import check_positive_int
from ..masks import sample_masks, sizes_at, uniform_sizes, unit_uniforms
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Estimator, check_size_rule

__all__ = ["RandomSize"]


@register
class RandomSize(Estimator):
    """``S_hat(x; M) / q(M)``, M ~ q; uniform q = 1/D gives D * S_hat(x; M). Unbiased.

    Parameters
    ----------
    num_masks : int
        P draws of (M, mask) per datum.
    share_masks : bool
        One (M, mask) per draw shared by every datum (dense data).
    stratified : bool
        Spread the sizes of a batch of sequences (the collator) or of the data
        over the quantile strata of q, one each: same distribution per
        element, less spread across the batch. On sequences, with an even
        ``num_masks`` = P, the P sizes of each sequence are systematic
        instead: two in each of P/2 quantile strata of q, so that the pairs
        give a calibrated standard error (P/2 degrees of freedom at most); the
        rule LLaDA-style evaluations use (systematic mask counts), with its
        error. An odd P keeps one size per stratum and reports the i.i.d.
        standard error, which then is conservative.

    Examples
    --------
    >>> import mptlml
    >>> from mptlml.models import PPCA
    >>> model = PPCA.random(8, 2, sigma2=0.2, seed=0)
    >>> x = model.sample(20, generator=0)
    >>> est = mptlml.estimate_lml(model, x, "random-size", num_masks=16, seed=0)
    >>> abs(est.mean - est.exact) < 5 * est.stderr + 1e-9
    True
    """

    name = "random-size"
    summary = "D * S_hat(x; M), M ~ U{1..D}; unbiased"
    ragged = True
    trainable = True
    per_sequence_sizes = True

    def __init__(self, num_masks: int = 1, *, share_masks: bool = False,
                 stratified: bool = False) -> None:
        super().__init__(num_masks, share_masks=share_masks)
        if not isinstance(stratified, bool):
            raise TypeError(f"stratified must be True or False, got {stratified!r}.")
        self.stratified = stratified

    def size_probs(self, num_tokens: int) -> torch.Tensor | None:
        """q(M) over M = 1..D (float64, ``(D,)``); None is the uniform q = 1/D."""
        return None

    def _q(self, d: int) -> torch.Tensor | None:
        q = self.size_probs(d)
        if q is None:
            return None
        q = torch.as_tensor(q, dtype=torch.float64)
        if q.shape != (d,) or not bool(torch.isfinite(q).all()) or bool((q <= 0).any()):
            raise ValueError(f"{type(self).__name__}.size_probs({d}) must give {d} positive "
                             f"probabilities (every size needs q(M) > 0 to stay unbiased); "
                             f"got shape {tuple(q.shape)}.")
        return q / q.sum()

    def _uniform(self) -> bool:
        return type(self).size_probs is RandomSize.size_probs

    def sizes(self, num_tokens: int | torch.Tensor, *, num_data: int | None = None,
              generator: torch.Generator | None = None) -> torch.Tensor:
        if isinstance(num_tokens, torch.Tensor):  # one size per sequence
            d = self.sequence_lengths(num_tokens)
            if self._uniform():
                return uniform_sizes(d, generator, self.stratified)
            # each sequence inverts its own q_i at its U_i (stratified over the batch or not)
            u = unit_uniforms(tuple(d.shape), generator, self.stratified)
            out = torch.zeros_like(d)
            for i, di in enumerate(d.tolist()):
                if di > 0:
                    out[i] = sizes_at(u[i:i + 1], d[i:i + 1], self._q(di))[0]
            return out
        d = check_positive_int(num_tokens, "num_tokens")
        p = self.num_masks
        shape = (p,) if num_data is None else (p, check_positive_int(num_data, "num_data"))
        return uniform_sizes(torch.full(shape, d), generator, self.stratified, self._q(d))

    def sequence_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                       counts: Sequence[np.ndarray], seed: int,
                       **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """Stratified with an even P: P/2 cells of two draws per sequence (systematic sizes).

        Draw p of sequence i falls in stratum ``pi_p // 2`` of q (pi a random
        permutation of the P draws): ``U_p = (pi_p // 2 + V_p) / (P / 2)``
        (:func:`~mptlml.masks.unit_uniforms` with ``per_stratum=2``),
        ``M_p = F_q^{-1}(U_p)`` (:func:`~mptlml.masks.sizes_at`). The estimate is the
        mean of the P terms ``w(M_p) S_hat(x_i; M_p)``, i.e. the sum over strata of each pair's
        mean over P/2; each pair's two draws are i.i.d. within its stratum.
        """
        p = self.num_masks
        if not self.stratified or p < 2 or p % 2:
            return super().sequence_cells(model, toks, counts, seed, **run)
        h = p // 2

        def draw(d: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            u = unit_uniforms((p,), g, stratified=True, per_stratum=2)
            m = sizes_at(u, torch.full((p,), d), self._q(d))
            check_size_rule(self, m, torch.full((p,), d))
            return m, (u * h).floor().long().clamp(max=h - 1)  # the stratum of each draw

        def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            return sample_masks(d, draw(d, g)[0], generator=g)

        out = run_pairs(model, toks, masks, seed=seed, tag=self.ragged_tag,
                        spec={"kind": "draws", "estimator": self.fingerprint(),
                              "num_masks": p, "total_pairs": p * len(toks)},
                        desc=f"{self.name} draws", **run)
        cells = []
        for i, (s, d) in enumerate(zip(out.sums, out.lengths, strict=True)):
            # the same sizes and strata again, from the same generator
            m, stratum = draw(int(d), torch.Generator().manual_seed(seq_seed(seed, i)))
            w = self.weights(m, torch.full_like(m, int(d)))
            terms = (w * torch.as_tensor(s, dtype=torch.float64) / m).numpy() / h
            cells.append([terms[(stratum == k).numpy()] for k in range(h)])
        return cells, out.num_model_calls

    def weights(self, sizes: torch.Tensor, num_tokens: int | torch.Tensor) -> torch.Tensor:
        if isinstance(num_tokens, torch.Tensor):  # one size per sequence
            d = num_tokens.flatten()
            if self._uniform():
                return torch.where(sizes > 0, d.double(), 0.0)
            return torch.tensor([1.0 / float(self._q(int(di))[int(m) - 1]) if int(m) > 0
                                 else 0.0 for di, m in zip(d, sizes.flatten(), strict=True)],
                                dtype=torch.float64)
        q = self._q(int(num_tokens))
        if q is None:
            return torch.full(sizes.shape, float(num_tokens), dtype=torch.float64)
        return 1.0 / q[sizes - 1]
