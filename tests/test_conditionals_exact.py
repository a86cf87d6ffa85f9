"""The VAE's Monte Carlo conditionals against exact ones, where they are known.

A :class:`~mptlml.models.GaussianVAE` with no hidden layer (``hidden=()``) is
linear: decoder f(z) = A z + c, encoder mu(x) = G x + g, logvar = const. With
A = Q diag(s) (orthonormal Q) and a fixed noise variance sigma2, the exact
posterior p(z | x) = N(Sigma A^T (x - c) / sigma2, Sigma), Sigma = diag(1 / (1
+ s^2 / sigma2)), is diagonal, so the encoder can be set to it exactly. The
model is then PPCA with W = A, mu = c: its conditionals log p(x_j | x_R) are
Gaussian conditioning (``PPCA.log_conditionals``, itself checked against
dense conditioning and scikit-learn in ``test_ppca.py``).

Both conditional estimators of the VAE must reproduce them:

- ``"is"`` (self-normalised importance sampling; consistent for any proposal);
- ``"iterated"`` (Rezende et al. 2014, App. F): with an exact encoder the
  encode-decode chain with the observed tokens clamped is a Gibbs sampler of
  p(z, x_M | x_R), so its estimate converges to the exact conditional.

The tolerance is set against the mistake that matters: a conditional that
ignores x_R (e.g. a chain that never clamps the observed tokens) gives the
marginal log p(x_j); the test asserts that the marginal misses the exact
conditional by many times the tolerance.
"""

from __future__ import annotations

import pytest
import torch

from mptlml.masks import sample_masks
from mptlml.models import PPCA, GaussianVAE

D, K, SCALES, SIGMA2, N = 8, 2, (2.0, 1.5), 1.0, 16
#: mean |error| over the masked entries that an estimator may make (measured ~0.005-0.01)
MEAN_TOL = 0.04
#: largest single |error| (measured 0.03 iterated, 0.13 importance sampling)
MAX_TOL = {"is": 0.25, "iterated": 0.1}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def linear_vae(**kwargs) -> tuple[GaussianVAE, PPCA]:
    """A linear VAE whose encoder is the exact posterior, and the same model as PPCA."""
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(D, K, generator=g, dtype=torch.float64))
    s = torch.tensor(SCALES, dtype=torch.float64)
    a = q * s
    c = 0.5 * torch.randn(D, generator=g, dtype=torch.float64)
    vae = GaussianVAE(D, K, hidden=(), sigma2=SIGMA2, learn_sigma2=False, **kwargs)
    post_var = 1.0 / (1.0 + s ** 2 / SIGMA2)
    gain = post_var[:, None] * a.T / SIGMA2  # (K, D): posterior mean = gain (x - c)
    (enc,), (dec,) = list(vae.encoder), list(vae.decoder)  # single linear layers
    with torch.no_grad():
        enc.weight.zero_()
        enc.bias.zero_()
        enc.weight[:K] = gain
        enc.bias[:K] = -gain @ c
        enc.bias[K:] = torch.log(post_var)
        dec.weight.copy_(a)
        dec.bias.copy_(c)
    torch.testing.assert_close(vae.sigma2, torch.full((D,), SIGMA2, dtype=torch.float64))
    return vae, PPCA(a, c, SIGMA2)


def _data_and_masks():
    _, ppca = linear_vae()
    x = ppca.sample(N, generator=1)
    # sizes 1..3: x_R holds most of the tokens, so the conditional is far from the marginal
    mask = sample_masks(D, torch.tensor([1, 2, 3]), num_data=N, generator=2)
    return x, mask


def _exact_and_marginal(ppca, x, mask):
    with torch.no_grad():
        exact = ppca.log_conditionals(x, mask)
        marginal = ppca.log_conditionals(x, torch.ones(D, dtype=torch.bool))  # R empty
    return exact, torch.where(mask, marginal.expand_as(exact), 0.0)


def test_encoder_is_the_exact_posterior():
    """With the exact posterior as proposal every importance weight is p(x): no error at all."""
    vae, ppca = linear_vae(lml_samples=3)
    x, _ = _data_and_masks()
    with torch.no_grad():
        torch.testing.assert_close(vae.log_marginal(x), ppca.log_marginal(x), atol=1e-10,
                                   rtol=0)


def test_tolerance_separates_the_marginal_from_the_conditional():
    """A conditional that ignores x_R (the marginal p(x_j)) misses by far more than MEAN_TOL."""
    _, ppca = linear_vae()
    x, mask = _data_and_masks()
    exact, marginal = _exact_and_marginal(ppca, x, mask)
    gap = float((marginal - exact)[mask].abs().mean())
    assert gap > 5 * MEAN_TOL, gap


@pytest.mark.parametrize("conditional,kwargs", [
    ("is", {"num_samples": 16384}),
    ("iterated", {"num_samples": 2048, "iterations": 30}),
])
def test_vae_conditionals_equal_exact(conditional, kwargs):
    vae, ppca = linear_vae(conditional=conditional, **kwargs)
    x, mask = _data_and_masks()
    exact, marginal = _exact_and_marginal(ppca, x, mask)
    with torch.no_grad():
        est = vae.log_conditionals(x, mask, generator=torch.Generator().manual_seed(3))
    assert (est[~mask] == 0).all()
    err = (est - exact)[mask].abs()
    gap = float((marginal - exact)[mask].abs().mean())
    assert float(err.mean()) < MEAN_TOL, (float(err.mean()), gap)
    assert float(err.max()) < MAX_TOL[conditional], float(err.max())
    # nearer the exact conditional than the marginal is, entry by entry on average
    assert float(err.mean()) < gap / 5
