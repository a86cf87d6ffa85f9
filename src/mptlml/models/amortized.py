"""Amortised Gaussian posteriors: the ELBO and importance-weighted bounds of a VAE.

A model with prior p(z) = N(0, I_K), a likelihood p(x | z) that factorises
over the D tokens, and an encoder q(z | x) = N(mu(x), diag(exp(logvar(x))))
gets from :class:`AmortizedGaussianMixin`

- the ELBO with the reparameterisation z = mu + exp(logvar / 2) * eps and the
  closed-form KL (Kingma & Welling, 2014, App. B)::

      ELBO(x) = E_q[log p(x | z)] - KL(q(z|x) || N(0, I)),
      KL      = 1/2 sum_k (mu_k^2 + exp(logvar_k) - 1 - logvar_k);

- importance weights log w_s = log p(x | z_s) + log p(z_s) - log q(z_s | x),
  z_s ~ q(z | x), whose log-mean-exp is the IWAE bound (Burda et al., 2016)
  and a consistent estimate of log p(x) as the number of samples grows.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_positive_int, make_generator

__all__ = ["AmortizedGaussianMixin", "gaussian_log_density", "iwae_bound",
           "standard_normal_noise"]

_LOG_2PI = math.log(2.0 * math.pi)


def gaussian_log_density(z: torch.Tensor, mu: torch.Tensor | None = None,
                         logvar: torch.Tensor | None = None) -> torch.Tensor:
    """log N(z; mu, diag(exp(logvar))) summed over the last axis (standard normal by default)."""
    if mu is None:
        return -0.5 * (z * z + _LOG_2PI).sum(-1)
    return -0.5 * ((z - mu) ** 2 * torch.exp(-logvar) + logvar + _LOG_2PI).sum(-1)


def iwae_bound(log_weights: torch.Tensor, num_samples: int | None = None) -> torch.Tensor:
    """The importance-weighted bound ``log (1/S) sum_s w_s`` from log-weights ``(S', ...)``.

    ``logsumexp`` over the first axis minus ``log S`` (Burda, Grosse &
    Salakhutdinov, 2016): a lower bound on log p(x) in expectation, tight as
    S grows. ``num_samples`` is S when the rows are already sums of chunks of
    weights (``log sum_{s in chunk} w_s``); by default S is the number of rows.
    """
    s = log_weights.shape[0] if num_samples is None else num_samples
    return torch.logsumexp(log_weights, 0) - math.log(s)


def standard_normal_noise(shape: tuple[int, ...], like: torch.Tensor,
                          generator: torch.Generator | None) -> torch.Tensor:
    """N(0, 1) noise drawn on the CPU from ``generator`` (reproducible), then moved to ``like``."""
    g = make_generator(generator) if generator is not None else None
    eps = torch.randn(*shape, generator=g, dtype=torch.float64)
    return eps.to(dtype=like.dtype, device=like.device)


class AmortizedGaussianMixin:
    """ELBO and importance weights for a model with a Gaussian encoder.

    The host class implements ``posterior_params(x) -> (mu, logvar)`` (each ``(..., K)``)
    and ``decoder_log_prob_tokens(x, z) -> (..., D)``, the per-token
    log p(x_d | z) broadcasting ``z`` of shape ``(S, ..., K)`` against ``x``.
    """

    latent_dim: int

    # The host provides (not defined here, so that the host's own methods win in the MRO):
    #   posterior_params(x) -> (mu, logvar);  decoder_log_prob_tokens(x, z) -> (..., D).

    def sample_posterior(self, mu: torch.Tensor, logvar: torch.Tensor, num_samples: int,
                         generator: torch.Generator | None) -> torch.Tensor:
        """Reparameterised draws z = mu + exp(logvar / 2) * eps, shape ``(S, *mu.shape)``."""
        s = check_positive_int(num_samples, "num_samples")
        eps = standard_normal_noise((s, *mu.shape), mu, generator)
        return mu + torch.exp(0.5 * logvar) * eps

    def elbo(self, x: torch.Tensor, *, num_samples: int = 1,
             generator: torch.Generator | None = None) -> torch.Tensor:
        """ELBO per datum ``(N,)``, reparameterised, with the closed-form Gaussian KL."""
        x = self.validate_data(x)  # type: ignore[attr-defined]
        mu, logvar = self.posterior_params(x)
        z = self.sample_posterior(mu, logvar, num_samples, generator)
        rec = self.decoder_log_prob_tokens(x, z).sum(-1).mean(0)
        kl = 0.5 * (mu * mu + torch.exp(logvar) - 1.0 - logvar).sum(-1)
        return rec - kl

    def log_importance_weights(self, x: torch.Tensor, *, num_samples: int,
                               generator: torch.Generator | None = None) -> torch.Tensor:
        """log p(x | z_s) + log p(z_s) - log q(z_s | x) for z_s ~ q(z | x): ``(S, N)``."""
        x = self.validate_data(x)  # type: ignore[attr-defined]
        mu, logvar = self.posterior_params(x)
        z = self.sample_posterior(mu, logvar, num_samples, generator)
        return (self.decoder_log_prob_tokens(x, z).sum(-1) + gaussian_log_density(z)
                - gaussian_log_density(z, mu, logvar))

    def iwae_log_marginal(self, x: torch.Tensor, *, num_samples: int,
                          generator: torch.Generator | None = None,
                          chunk: int = 256) -> torch.Tensor:
        """Importance-sampling estimate of log p(x) with the encoder as proposal, ``(N,)``.

        ``log (1/S) sum_s w_s`` (the IWAE bound, :func:`iwae_bound`, consistent
        as S grows), computed in chunks of samples to bound memory.
        """
        s = check_positive_int(num_samples, "num_samples")
        parts = []
        done = 0
        while done < s:
            c = min(chunk, s - done)
            parts.append(torch.logsumexp(
                self.log_importance_weights(x, num_samples=c, generator=generator), 0))
            done += c
        return iwae_bound(torch.stack(parts), s)
