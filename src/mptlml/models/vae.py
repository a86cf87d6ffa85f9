"""A deep VAE with a Gaussian likelihood and Monte Carlo masked conditionals.

Model (the paper's Fig. 3 bottom)::

    z ~ N(0, I_K),   x | z ~ N(f(z), diag(sigma2)),   q(z | x) = N(mu(x), diag(exp(logvar(x)))),

with MLP decoder f and encoder (mu, logvar). Nothing is tractable, so

- log p(x) is estimated by importance sampling with the encoder as proposal
  (``log (1/S) sum_s p(x, z_s) / q(z_s | x)``, the IWAE bound; Burda et al.,
  2016), from a fixed seed so that :meth:`log_marginal` is deterministic;
- log p(x_j | x_R) is estimated in one of two ways (``conditional=``):

  ``"is"``: self-normalised importance sampling with the encoder fed the
  masked input x~ (masked tokens set to 0) as proposal, z_s ~ q(z | x~)::

      log w_s          = log p(x_R | z_s) + log p(z_s) - log q(z_s | x~)
      log p(x_j | x_R) ~ logsumexp_s [log w_s + log p(x_j | z_s)] - logsumexp_s log w_s,

  a ratio of two consistent estimators of p(x_j, x_R) and p(x_R), hence
  consistent as ``num_samples`` grows;

  ``"iterated"``: iterated encoding-decoding (Rezende, Mohamed & Wierstra,
  2014, App. F): impute the masked tokens (start at 0), encode, sample z,
  decode, re-sample the masked tokens from p(x_M | z), repeat ``iterations``
  times; then log p(x_j | x_R) ~ log (1/S) sum_s p(x_j | z_s) over S parallel
  chains. The imputation chain is not differentiated; the last encoding and
  decoding are. This is what the paper used; it is not consistent in general
  (the chain targets p(x_M | x_R) only for an exact encoder).

Both are Monte Carlo, so ``stochastic = True`` and the results are
reproducible from the ``generator`` argument.

The IS estimate of log p(x) is only as good as its proposal. A VAE trained
by MPT never fits its encoder to the full-data posterior (the encoder is
trained only through the masked conditionals), so IS with its own encoder
can underestimate log p(x) by tens of nats. :class:`DecoderProposal` is a
separate encoder fitted by the ELBO to the *frozen* decoder (the decoder is
never changed by it): IS with it estimates the LML of the decoder itself,
whatever objective trained it.

References
----------
Kingma & Welling (2014), "Auto-encoding variational Bayes", ICLR.
Rezende, Mohamed, Wierstra (2014), "Stochastic backpropagation and approximate
inference in deep generative models", ICML, Appendix F.
Burda, Grosse, Salakhutdinov (2016), "Importance weighted autoencoders", ICLR.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .._validation import check_positive_int, make_generator
from .amortized import AmortizedGaussianMixin, gaussian_log_density, standard_normal_noise
from .base import MaskedModel

__all__ = ["DecoderProposal", "GaussianVAE"]

_LOG_2PI = math.log(2.0 * math.pi)
CONDITIONALS = ("is", "iterated")
#: elements of the largest (samples x rows x D) temporary of the conditionals.
_CHUNK_ELEMENTS = 1 << 22


def _mlp(sizes: Sequence[int], activation: str) -> nn.Sequential:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}[activation]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class GaussianVAE(AmortizedGaussianMixin, MaskedModel):
    """VAE with MLP encoder/decoder and a Gaussian likelihood; Monte Carlo LML and conditionals.

    Parameters
    ----------
    num_tokens : int
        D.
    latent_dim : int
        K.
    hidden : sequence of int
        Hidden widths of both MLPs (mirrored in the decoder).
    activation : {"tanh", "relu", "elu"}
    sigma2 : float
        Initial likelihood variance (per token).
    min_sigma2 : float
        Floor of the variance, sigma2_d = min_sigma2 + exp(raw_d), which keeps
        the likelihood bounded on constant pixels.
    learn_sigma2 : bool
        Train the per-token variances.
    conditional : {"is", "iterated"}
        How :meth:`log_conditionals` estimates log p(x_j | x_R) (module docstring).
    num_samples : int
        S, importance samples (``"is"``) or parallel chains (``"iterated"``).
    iterations : int
        Encode-decode steps of ``"iterated"``.
    lml_samples : int
        Importance samples of :meth:`log_marginal`.
    lml_seed : int
        Seed of :meth:`log_marginal` (deterministic for given parameters).
    seed : int
        Initialisation of the MLPs.
    dtype : torch.dtype
    """

    stochastic = True

    def __init__(self, num_tokens: int, latent_dim: int, hidden: Sequence[int] = (128,), *,
                 activation: str = "tanh", sigma2: float = 0.1, min_sigma2: float = 1e-3,
                 learn_sigma2: bool = True, conditional: str = "is", num_samples: int = 64,
                 iterations: int = 10, lml_samples: int = 256, lml_seed: int = 0,
                 seed: int = 0, dtype: torch.dtype = torch.float64) -> None:
        super().__init__()
        d = check_positive_int(num_tokens, "num_tokens")
        k = check_positive_int(latent_dim, "latent_dim")
        hidden = [check_positive_int(h, "hidden width") for h in hidden]
        if activation not in ("tanh", "relu", "elu"):
            raise ValueError(f"activation must be 'tanh', 'relu' or 'elu', got {activation!r}.")
        if conditional not in CONDITIONALS:
            raise ValueError(f"conditional must be one of {CONDITIONALS}, got {conditional!r}.")
        if not (0 < min_sigma2 < sigma2 and math.isfinite(sigma2)):
            raise ValueError(
                f"need 0 < min_sigma2 < sigma2 (finite); got min_sigma2={min_sigma2}, "
                f"sigma2={sigma2}."
            )
        self.num_tokens, self.latent_dim = d, k
        self.conditional = conditional
        self.num_samples = check_positive_int(num_samples, "num_samples")
        self.iterations = check_positive_int(iterations, "iterations")
        self.lml_samples = check_positive_int(lml_samples, "lml_samples")
        self.lml_seed = int(lml_seed)
        self.min_sigma2 = float(min_sigma2)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = _mlp([d, *hidden, 2 * k], activation).to(dtype)
            self.decoder = _mlp([k, *hidden[::-1], d], activation).to(dtype)
        raw = torch.full((d,), math.log(sigma2 - min_sigma2), dtype=dtype)
        if learn_sigma2:
            self.raw_sigma2 = nn.Parameter(raw)
        else:
            self.register_buffer("raw_sigma2", raw)

    # ------------------------------------------------------------------ model
    @property
    def sigma2(self) -> torch.Tensor:
        """Per-token likelihood variance, ``(D,)``."""
        return self.min_sigma2 + torch.exp(self.raw_sigma2)

    def posterior_params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of q(z | x), each ``(..., K)``."""
        h = self.encoder(x)
        return h[..., : self.latent_dim], h[..., self.latent_dim:]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Likelihood mean f(z), ``(..., D)``."""
        return self.decoder(z)

    def decoder_log_prob_tokens(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """log N(x_d; f_d(z), sigma2_d), broadcasting ``z`` (..., K) against ``x``."""
        s2 = self.sigma2
        return -0.5 * ((x - self.decode(z)) ** 2 / s2 + torch.log(s2) + _LOG_2PI)

    @torch.no_grad()
    def sample(self, n: int, *, generator: int | torch.Generator | None = None) -> torch.Tensor:
        """Draw ``n`` observations from the generative model."""
        n = check_positive_int(n, "n")
        g = make_generator(generator)
        z = standard_normal_noise((n, self.latent_dim), self.raw_sigma2, g)
        eps = standard_normal_noise((n, self.num_tokens), self.raw_sigma2, g)
        return self.decode(z) + self.sigma2.sqrt() * eps

    # ------------------------------------------------------------------ protocol
    def _log_marginal(self, x: torch.Tensor) -> torch.Tensor:
        """IS estimate of log p(x) with ``lml_samples`` draws from the encoder (fixed seed)."""
        g = torch.Generator().manual_seed(self.lml_seed)
        return self.iwae_log_marginal(x, num_samples=self.lml_samples, generator=g)

    def _log_conditionals(self, x: torch.Tensor, mask: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
        b, n, d = mask.shape[0], x.shape[0], self.num_tokens
        m = (mask[:, None, :] if mask.ndim == 2 else mask).expand(b, n, d).reshape(b * n, d)
        xr = x.expand(b, n, d).reshape(b * n, d)
        g = make_generator(generator)
        rows = max(1, _CHUNK_ELEMENTS // (self.num_samples * d))
        fn = self._snis if self.conditional == "is" else self._iterated
        out = [fn(xr[s:s + rows], m[s:s + rows], g) for s in range(0, b * n, rows)]
        return torch.cat(out).reshape(b, n, d)

    def _snis(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        r = (~mask).to(x.dtype)
        mu, logvar = self.posterior_params(x * r)
        z = self.sample_posterior(mu, logvar, self.num_samples, g)  # (S, R, K)
        ll = self.decoder_log_prob_tokens(x, z)  # (S, R, D)
        logw = (ll * r).sum(-1) + gaussian_log_density(z) - gaussian_log_density(z, mu, logvar)
        out = torch.logsumexp(logw[..., None] + ll, 0) - torch.logsumexp(logw, 0)[..., None]
        return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))

    def _iterated(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        r = (~mask).to(x.dtype)
        s = self.num_samples
        xhat = (x * r).expand(s, *x.shape)
        with torch.no_grad():
            sd = self.sigma2.sqrt()
            for _ in range(self.iterations):
                mu, logvar = self.posterior_params(xhat)
                z = mu + torch.exp(0.5 * logvar) * standard_normal_noise(mu.shape, mu, g)
                noisy = self.decode(z) + sd * standard_normal_noise(xhat.shape, xhat, g)
                xhat = x * r + noisy * (1.0 - r)
        mu, logvar = self.posterior_params(xhat)
        z = mu + torch.exp(0.5 * logvar) * standard_normal_noise(mu.shape, mu, g)
        out = torch.logsumexp(self.decoder_log_prob_tokens(x, z), 0) - math.log(s)
        return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device))

    def extra_repr(self) -> str:
        return (f"D={self.num_tokens}, K={self.latent_dim}, conditional={self.conditional!r}, "
                f"num_samples={self.num_samples}")



class DecoderProposal(AmortizedGaussianMixin, nn.Module):
    """An encoder fitted by the ELBO to a :class:`GaussianVAE`'s frozen decoder: an IS proposal.

    ``q_phi(z | x) = N(mu_phi(x), diag(exp(logvar_phi(x))))`` with the VAE's
    encoder architecture and fresh weights. :meth:`fit` takes Adam steps on
    ``phi`` only, maximising the ELBO of the VAE's *current* decoder and
    likelihood variances::

        ELBO_phi(x) = E_q_phi[log p_theta(x | z)] - KL(q_phi(z | x) || N(0, I)),

    with theta held fixed (no gradient reaches the VAE). Called at each
    checkpoint of a training run with the same instance, it tracks the
    decoder (an amortised encoder trained alongside, warm-started);
    :meth:`log_marginal` is then the IS estimate of log p_theta(x) with
    ``q_phi`` as proposal (Burda et al., 2016), a lower bound in expectation
    that tightens as ``q_phi`` approaches the posterior. This is how the LML
    of a VAE trained by MPT is evaluated in Fig. 3: with its own encoder,
    which MPT trains only through the masked conditionals, IS underestimates
    it.

    Parameters
    ----------
    vae : GaussianVAE
        The model whose decoder is evaluated (read at every call: the
        proposal follows the decoder as it trains).
    lr : float
        Adam learning rate of the proposal.
    seed : int
        Initialisation of the proposal's weights and the seed of its ELBO
        noise (its own generator: the VAE's training randomness is untouched).
    hidden : sequence of int, optional
        Hidden widths; the VAE's encoder's by default.
    activation : {"tanh", "relu", "elu"}
    """

    def __init__(self, vae: GaussianVAE, *, lr: float = 1e-3, seed: int = 0,
                 hidden: Sequence[int] | None = None, activation: str = "tanh") -> None:
        super().__init__()
        if not isinstance(vae, GaussianVAE):
            raise TypeError(f"vae must be a GaussianVAE, got {type(vae).__name__}.")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}.")
        self._vae = [vae]  # a list: not registered as a sub-module, so never optimised here
        self.latent_dim = vae.latent_dim
        if hidden is None:
            hidden = [m.out_features for m in vae.encoder if isinstance(m, nn.Linear)][:-1]
        dtype = vae.raw_sigma2.dtype
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = _mlp([vae.num_tokens, *hidden, 2 * vae.latent_dim],
                                activation).to(dtype=dtype, device=vae.raw_sigma2.device)
        self._opt = torch.optim.Adam(self.encoder.parameters(), lr=lr)
        self._generator = torch.Generator().manual_seed(int(seed) + 1)
        self.steps = 0

    @property
    def vae(self) -> GaussianVAE:
        return self._vae[0]

    def validate_data(self, x: torch.Tensor) -> torch.Tensor:
        return self.vae.validate_data(x)

    def posterior_params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of the proposal q_phi(z | x), each ``(..., K)``."""
        h = self.encoder(x)
        return h[..., : self.latent_dim], h[..., self.latent_dim:]

    def decoder_log_prob_tokens(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The VAE's log N(x_d; f_d(z), sigma2_d) (its current decoder)."""
        return self.vae.decoder_log_prob_tokens(x, z)

    def fit(self, x: torch.Tensor, steps: int, *, batch_size: int | None = None) -> float:
        """``steps`` Adam steps on the proposal's ELBO (full batch by default); its last value.

        Gradients are taken with respect to the proposal's weights only
        (:func:`torch.autograd.grad`): the VAE's parameters and their
        ``.grad`` are left exactly as they were. Runs with gradients enabled
        even inside ``torch.no_grad()`` (e.g. a training monitor).
        """
        steps = check_positive_int(steps, "steps")
        x = self.validate_data(x)
        n = x.shape[0]
        bs = n if batch_size is None else min(check_positive_int(batch_size, "batch_size"), n)
        params = list(self.encoder.parameters())
        value = math.nan
        with torch.enable_grad():
            for _ in range(steps):
                xb = x if bs == n else x[torch.randperm(n, generator=self._generator)[:bs]]
                elbo = self.elbo(xb, generator=self._generator).mean()
                grads = torch.autograd.grad(-elbo, params)
                for p, g in zip(params, grads, strict=True):
                    p.grad = g
                self._opt.step()
                self._opt.zero_grad(set_to_none=True)
                value = float(elbo.detach())
                self.steps += 1
        if not math.isfinite(value):
            raise ValueError(f"the proposal's ELBO became {value} after {self.steps} steps; "
                             "lower its learning rate.")
        return value

    @torch.no_grad()
    def log_marginal(self, x: torch.Tensor, *, num_samples: int,
                     generator: int | torch.Generator | None = None) -> torch.Tensor:
        """IS estimate of the VAE's log p(x) with this proposal, ``(N,)`` (IWAE bound)."""
        return self.iwae_log_marginal(x, num_samples=num_samples,
                                      generator=make_generator(generator))
