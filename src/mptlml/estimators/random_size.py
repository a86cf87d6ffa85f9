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

On ragged sequences the P draws of a sequence are distinct masks: draw k is made
from the masks not drawn before (a draw that repeats an earlier mask is drawn
again), and the estimate is the mean of des Raj's ordered terms
(:func:`~mptlml.estimators.stats.des_raj`), with p(mask) = q(M) / C(D, M) and
``y(mask) / p(mask) = S_hat(x; M) / q(M)`` (the with-replacement draw)::

    t_1 = S_hat_1 / q(M_1),
    t_k = sum_{j<k} S_hat_j / C(D, M_j) + (S_hat_k / q(M_k)) (1 - sum_{j<k} p_j),
    estimate = mean_k t_k,   se^2 = sum_k (t_k - mean)^2 / (P (P - 1))   (P - 1 dof),

both unbiased. Drawn with replacement, the P draws of a short continuation
repeated each other often (both of P = 2 draws on the one mask of size D = 5 in
1 of 25 sequences; some mask twice in 1 of 16): a standard error of 0 on
infinite degrees of freedom, a promise of exactness for an estimate that is not
exact. A size whose population is no larger than the draws of its stratum keeps
i.i.d. draws (its term is then as good as enumerated).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._scoring.ragged import run_pairs, sequence_seed
from .._validation import check_positive_int
from ..masks import sample_masks, sizes_at, uniform_sizes, unit_uniforms
from ..models.protocols import RaggedMaskedModel
from .api import register
from .base import Estimator, check_size_rule
from .stats import des_raj

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
    >>> abs(est.mean - est.exact_lml) < 5 * est.stderr + 1e-9
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
        sum over strata of each pair's mean over P/2; each pair's two masks are drawn
        within its stratum without replacement (des Raj's terms, module docstring, with
        the stratum's own probabilities ``q_h(M) / C(D, M)``, ``q_h`` the mass of size M
        inside the stratum times P/2).
        """
        p = self.num_masks
        if not self.stratified or p < 2 or p % 2:
            return super().sequence_cells(model, toks, counts, seed, **run)
        return self._distinct_cells(model, toks, [p] * len(toks), seed, pairs=True,
                                    tag=self.ragged_tag, **run)

    def ragged_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                     counts: Sequence[np.ndarray], seed: int, *, tag: str,
                     units: list[torch.Tensor] | None = None,
                     **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """``counts[i][0]`` distinct draws of sequence i, one cell of des Raj's terms
        (module docstring); stratified over the draws (an odd P, a plan): i.i.d. draws
        one per quantile stratum, as :meth:`Estimator.ragged_cells`."""
        if self.stratified:
            return super().ragged_cells(model, toks, counts, seed, tag=tag, units=units, **run)
        return self._distinct_cells(model, toks, [int(c[0]) for c in counts], seed,
                                    pairs=False, tag=tag, units=units, **run)

    def _distinct_draws(self, d: int, p: int, g: torch.Generator, pairs: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                   torch.Tensor]:
        """P masks of a sequence of ``d`` units, distinct within each stratum (one, or P/2
        of two draws each with ``pairs``): ``(masks, sizes, stratum, probs, distinct)``,
        ``probs`` each mask's probability under its stratum's draw, ``distinct`` whether
        its stratum was drawn without replacement (more masks than draws)."""
        h = p // 2 if pairs else 1
        q = self._q(d)
        qq = torch.full((d,), 1.0 / d, dtype=torch.float64) if q is None else q
        u = unit_uniforms((p,), g, stratified=pairs, per_stratum=2)
        stratum = (u * h).floor().long().clamp(max=h - 1)
        full = torch.full((p,), d)
        m = sizes_at(u, full, q)
        check_size_rule(self, m, full)
        masks = sample_masks(d, m, generator=g)
        # q_h(M): the mass of size M inside stratum h, times h (the stratum's size law)
        cdf = torch.cat([torch.zeros(1, dtype=torch.float64), qq.cumsum(0) / qq.sum()])
        lo = torch.arange(h, dtype=torch.float64)[:, None] / h
        overlap = (torch.minimum(cdf[1:][None], lo + 1.0 / h)
                   - torch.maximum(cdf[:-1][None], lo)).clamp_min(0.0) * h  # (h, D)
        if d <= 60:  # C(D, M) exactly
            comb = torch.tensor([float(math.comb(d, m)) for m in range(1, d + 1)],
                                dtype=torch.float64)
        else:  # as floats from log-gammas (inf past what a float holds)
            k = torch.arange(1, d + 1, dtype=torch.float64)
            comb = (torch.lgamma(torch.tensor(d + 1.0)) - torch.lgamma(k + 1)
                    - torch.lgamma(d - k + 1)).exp()
        population = torch.where(overlap > 0, comb, 0.0).sum(1)
        distinct = population[stratum] > torch.bincount(stratum, minlength=h)[stratum]
        seen: set[tuple[int, bytes]] = set()
        for k in range(p):
            s = int(stratum[k])
            key = (s, masks[k].numpy().tobytes())
            while bool(distinct[k]) and key in seen:  # drawn again from the rest
                uk = (s + torch.rand(1, generator=g, dtype=torch.float64)) / h
                m[k] = sizes_at(uk, full[:1], q)[0]
                masks[k] = sample_masks(d, m[k:k + 1], generator=g)[0]
                key = (s, masks[k].numpy().tobytes())
            seen.add(key)
        probs = overlap[stratum, m - 1] / comb[m - 1]
        return masks, m, stratum, probs, distinct

    def _distinct_cells(self, model: RaggedMaskedModel, toks: list[torch.Tensor],
                        draws: list[int], seed: int, *, pairs: bool, tag: str,
                        **run: Any) -> tuple[list[list[np.ndarray]], int]:
        """The cells of :meth:`_distinct_draws`' masks: per stratum, des Raj's terms over
        the number of strata (its draws' own terms where drawn with replacement)."""

        def masks(i: int, d: int, g: torch.Generator) -> torch.Tensor:
            return self._distinct_draws(d, draws[i], g, pairs)[0]

        out = run_pairs(model, toks, masks, seed=seed, tag=tag,
                        spec={"kind": "draws", "estimator": self.fingerprint(),
                              "num_masks": draws[0] if len(set(draws)) == 1 else draws,
                              "total_pairs": sum(draws)}, desc=f"{self.name} draws", **run)
        cells = []
        for i, (s, d) in enumerate(zip(out.sums, out.lengths, strict=True)):
            # the same masks again, from the same generator
            _, m, stratum, probs, distinct = self._distinct_draws(
                int(d), draws[i], torch.Generator().manual_seed(sequence_seed(seed, i)), pairs)
            w = self.weights(m, torch.full_like(m, int(d)))
            ratio = (w * torch.as_tensor(s, dtype=torch.float64) / m).numpy()
            h = draws[i] // 2 if pairs else 1
            cell = []
            for k in range(h):
                sel = (stratum == k).numpy()
                r = ratio[sel]
                terms = des_raj(r, probs.numpy()[sel]) if bool(distinct[sel].all()) else r
                cell.append(terms / h)
            cells.append(cell)
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
