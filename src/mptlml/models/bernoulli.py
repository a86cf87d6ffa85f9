"""Bernoulli latent linear model by quadrature, and its linear VAE.

Model (the paper's Sec. 4, Fig. 3 top)::

    z ~ N(0, I_K),   x_d | z ~ Bernoulli(sigmoid(w_d^T z + b_d)),  d = 1..D.

With a quadrature rule (nodes z_g, weights pi_g summing to one, see
:mod:`mptlml.models.quadrature`) the model becomes the finite mixture
p(x) = sum_g pi_g prod_d p(x_d | z_g), and everything is exact for it:

    log p(x)         = logsumexp_g [log pi_g + log p(x | z_g)]
    log p(x_j | x_R) = logsumexp_g [log pi_g + log p(x_R | z_g) + log p(x_j | z_g)]
                     - logsumexp_g [log pi_g + log p(x_R | z_g)].

With a_g = W z_g + b, log p(x_d | z_g) = x_d a_gd + log sigmoid(-a_gd), so
log p(x_R | z_g) for a whole block of masks is one GEMM of the observed data
``r * x`` against the ``(D, G)`` logits; the conditionals are then
log sum_g q_g(R) sigmoid(+-a_gj), with q(R) = softmax_g of the above, i.e. a
second GEMM of the ``(B, N, G)`` posterior weights against the ``(G, D)``
token probabilities (shifted per column by their maximum for range). Masks
and grid points are batched in one pass.

The chain rule of these conditionals telescopes exactly to log p(x) of the
same rule, so the exhaustive MPT estimator reproduces :meth:`log_marginal`
to rounding error.

Paper's variant. The authors' code scored the *marginal* log p(x_M) of the
masked pixels (R ignored) rather than the conditional; pass
``mpt_term="marginal"`` to get it (its per-mask sum is log p(x_M), spread
evenly over the masked positions by ``log_conditionals``). It is not an
estimator of the LML through Proposition 1; it is there for comparison.

References
----------
Moreno-Munoz, Recasens, Hauberg (2023), "On Masked Pre-training and the
Marginal Likelihood", NeurIPS, Sec. 4; erratum in ``docs/notes.md``, "Errata".
Kingma & Welling (2014), "Auto-encoding variational Bayes", ICLR.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import as_tensor, check_positive_int, make_generator
from .amortized import AmortizedGaussianMixin
from .base import MaskedModel
from .quadrature import latent_quadrature

__all__ = ["BernoulliLVM", "LinearVAE"]

MPT_TERMS = ("conditional", "marginal")


def _check_binary(x: torch.Tensor, name: str) -> None:
    bad = (x != 0) & (x != 1)
    if bool(bad.any()):
        v = float(x[bad][0])
        raise ValueError(
            f"{name} needs binary data with values in {{0, 1}}; got {int(bad.sum())} other "
            f"value(s), e.g. {v:g}. Binarise first, e.g. mptlml.data.binarize(x, threshold=0.5) "
            "or mptlml.data.load_images(..., binarized=True)."
        )


class BernoulliLVM(MaskedModel):
    """Bernoulli latent linear model p(x|z) = Bernoulli(sigmoid(W z + b)), z ~ N(0, I_K).

    Parameters
    ----------
    W : array-like of shape (D, K)
        Loadings (trainable). Its float dtype is kept; others become float64.
    b : array-like of shape (D,), optional
        Biases (trainable), zeros by default.
    quadrature : {"grid", "gauss-hermite"}
        ``"grid"``: the paper's tensor grid of ``num_points`` per axis on
        [-bound, bound] (20 x 20 on [-5, 5]^2 for K = 2); refused for K > 3.
        ``"gauss-hermite"``: tensor Gauss-Hermite rule, more accurate per node.
    num_points : int
        Points per latent axis (G = num_points^K nodes).
    bound : float
        Half-width of the dense grid.
    mpt_term : {"conditional", "marginal"}
        ``"conditional"`` (default): the true log p(x_j | x_R).
        ``"marginal"``: the paper's code, log p(x_M) of the masked tokens.

    Examples
    --------
    >>> from mptlml.models import BernoulliLVM
    >>> model = BernoulliLVM.random(6, 2, seed=0)
    >>> x = model.sample(4, generator=0)
    >>> model.log_marginal(x).shape
    torch.Size([4])
    """

    def __init__(self, W: Any, b: Any = None, *, quadrature: str = "grid", num_points: int = 20,
                 bound: float = 5.0, mpt_term: str = "conditional",
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        w = as_tensor(W, "W", dtype=dtype)
        if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
            raise ValueError(f"W must have shape (D, K) with D, K >= 1; got {tuple(w.shape)}.")
        d, k = w.shape
        bias = torch.zeros(d, dtype=w.dtype) if b is None else as_tensor(b, "b", dtype=w.dtype)
        if bias.shape != (d,):
            raise ValueError(f"b must have shape (D,) = ({d},), got {tuple(bias.shape)}.")
        for name, t in (("W", w), ("b", bias)):
            if not torch.isfinite(t).all():
                raise ValueError(f"{name} contains NaN or infinite values.")
        if mpt_term not in MPT_TERMS:
            raise ValueError(f"mpt_term must be one of {MPT_TERMS}, got {mpt_term!r}.")
        self.num_tokens = d
        self.latent_dim = k
        self.mpt_term = mpt_term
        self.W = nn.Parameter(w)
        self.b = nn.Parameter(bias)
        self.set_quadrature(quadrature, num_points, bound)

    # ------------------------------------------------------------------ set-up
    def set_quadrature(self, quadrature: str = "grid", num_points: int = 20,
                       bound: float = 5.0) -> None:
        """(Re)build the quadrature rule; see :func:`~.quadrature.latent_quadrature`."""
        nodes, log_w = latent_quadrature(self.latent_dim, quadrature, num_points, bound)
        dt, dev = self.W.dtype, self.W.device
        self.register_buffer("nodes", nodes.to(dtype=dt, device=dev), persistent=False)
        self.register_buffer("log_weights", log_w.to(dtype=dt, device=dev), persistent=False)
        self.quadrature, self.num_points, self.bound = quadrature, num_points, bound

    @classmethod
    def random(cls, num_tokens: int, latent_dim: int, *, scale: float = 1.0,
               seed: int | torch.Generator | None = None, dtype: torch.dtype = torch.float64,
               **kwargs: Any) -> BernoulliLVM:
        """W with N(0, scale^2) entries, b with N(0, 1) entries."""
        g = make_generator(seed)
        d = check_positive_int(num_tokens, "num_tokens")
        k = check_positive_int(latent_dim, "latent_dim")
        w = scale * torch.randn(d, k, generator=g, dtype=torch.float64)
        b = torch.randn(d, generator=g, dtype=torch.float64)
        return cls(w.to(dtype), b.to(dtype), **kwargs)

    def validate_data(self, x: Any) -> torch.Tensor:
        """As the base class, and the values must be 0 or 1."""
        xt = super().validate_data(x)
        _check_binary(xt, type(self).__name__)
        return xt

    # ------------------------------------------------------------------ model
    def decoder_log_prob_tokens(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """log p(x_d | z) = x_d a_d + log sigmoid(-a_d), a = W z + b; broadcasts ``z`` (..., K)."""
        a = z @ self.W.T + self.b
        return x * a + F.logsigmoid(-a)

    @torch.no_grad()
    def sample(self, n: int, *, generator: int | torch.Generator | None = None) -> torch.Tensor:
        """Draw ``n`` binary observations from the continuous model (z ~ N(0, I))."""
        n = check_positive_int(n, "n")
        g = make_generator(generator)
        z = torch.randn(n, self.latent_dim, generator=g, dtype=torch.float64)
        p = torch.sigmoid(z @ self.W.detach().double().cpu().T + self.b.detach().double().cpu())
        x = (torch.rand(n, self.num_tokens, generator=g, dtype=torch.float64) < p).double()
        return x.to(dtype=self.dtype, device=self.device)

    def node_logits(self) -> torch.Tensor:
        """a_g = W z_g + b at the quadrature nodes, ``(G, D)``."""
        return self.nodes @ self.W.T + self.b

    def _log_joint_observed(self, x: torch.Tensor, r: torch.Tensor,
                            a: torch.Tensor) -> torch.Tensor:
        """log pi_g + log p(x_R | z_g), ``(B, N, G)``, for observed indicators ``r`` (B, [N,] D)."""
        c = F.logsigmoid(-a)  # (G, D)
        if r.ndim == 2:
            obs = torch.matmul(x, (r[:, :, None] * a.T)) + (r @ c.T)[:, None, :]
            return obs + self.log_weights
        # one GEMM: [r * x, r, 1] @ [a, c, log pi]^T (no (B, N, G)-sized additions)
        feats = torch.cat([r * x, r, torch.ones_like(r[..., :1])], dim=-1)
        return feats @ torch.cat([a, c, self.log_weights[:, None]], dim=1).T

    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        """logsumexp_g [log pi_g + log p(x | z_g)] (quadrature), ``(N,)``."""
        a = self.node_logits()
        ll = x @ a.T + F.logsigmoid(-a).sum(1)
        return torch.logsumexp(ll + self.log_weights, dim=-1)

    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        m = mask[:, None, :] if mask.ndim == 2 else mask
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        if self.mpt_term == "marginal":
            lp = self.masked_log_prob(x, mask, generator)  # (B, N)
            return torch.where(m, (lp / m.sum(-1).clamp_min(1))[..., None], zero)
        a = self.node_logits()
        d = self.num_tokens
        q = torch.softmax(self._log_joint_observed(x, (~mask).to(x.dtype), a), dim=-1)
        ls = torch.cat([F.logsigmoid(a), F.logsigmoid(-a)], dim=1)  # (G, 2D): x = 1 | x = 0
        shift = ls.detach().max(0).values
        p = q @ torch.exp(ls - shift)  # (B, N, 2D), each in (0, 1] after the shift
        lp = torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)) + shift
        out = torch.where(x > 0.5, lp[..., :d], lp[..., d:])
        return torch.where(m, out, zero)

    def block_cost(self, num_data: int, shared: bool) -> int:
        """(N, G) posterior weights and (N, 2D) predictive probabilities per mask."""
        return num_data * (self.nodes.shape[0] + 2 * self.num_tokens + 1)

    def masked_log_prob(self, x: torch.Tensor, mask: torch.Tensor,
                         generator: torch.Generator | None) -> torch.Tensor:
        if self.mpt_term == "marginal":  # the paper's code: log p(x_M), R ignored
            return torch.logsumexp(
                self._log_joint_observed(x, mask.to(x.dtype), self.node_logits()), dim=-1)
        return self._log_conditionals(x, mask, generator).sum(-1)


class LinearVAE(AmortizedGaussianMixin, BernoulliLVM):
    """The Bernoulli latent linear model with a linear Gaussian encoder (a linear VAE).

    Decoder as :class:`BernoulliLVM` (its LML and conditionals by quadrature);
    encoder q(z | x) = N(E x + e, diag(exp(F x + f))), trained with
    :class:`mptlml.objectives.ELBO`.

    Parameters
    ----------
    W, b
        Decoder, as :class:`BernoulliLVM`.
    encoder_seed : int, optional
        Seed of the small random initialisation of the encoder means (E ~
        N(0, 0.01^2)); F = 0, f = 0 (unit posterior variance at start).
    **kwargs
        Quadrature options of :class:`BernoulliLVM`.
    """

    def __init__(self, W: Any, b: Any = None, *, encoder_seed: int | None = 0,
                 **kwargs: Any) -> None:
        super().__init__(W, b, **kwargs)
        d, k = self.num_tokens, self.latent_dim
        g = make_generator(encoder_seed)
        dt = self.W.dtype
        self.enc_mean_W = nn.Parameter(0.01 * torch.randn(k, d, generator=g,
                                                          dtype=torch.float64).to(dt))
        self.enc_mean_b = nn.Parameter(torch.zeros(k, dtype=dt))
        self.enc_logvar_W = nn.Parameter(torch.zeros(k, d, dtype=dt))
        self.enc_logvar_b = nn.Parameter(torch.zeros(k, dtype=dt))

    def posterior_params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of q(z | x), each ``(..., K)``."""
        return (x @ self.enc_mean_W.T + self.enc_mean_b,
                x @ self.enc_logvar_W.T + self.enc_logvar_b)

