"""mptlml.hf: the MPT data collator, its loss, and the Trainer subclass."""

from __future__ import annotations

import math

import pytest
import torch

from mptlml import estimate_lml
from mptlml.estimators import create
from mptlml.estimators.chain_rule import distinct_orders
from mptlml.estimators.sequential import round_seed
from mptlml.hf import (
    DataCollatorForMPT,
    mpt_batch_loss,
    mpt_loss,
    sample_random_order,
)
from mptlml.masks import fixed_rate_size, prefix_masks
from mptlml.models import MaskedLM
from mptlml.seeds import spawn

from .mlm_helpers import SENTENCES, make_tiny_bert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer, BertForMaskedLM

    path = make_tiny_bert(tmp_path_factory.mktemp("hf") / "bert", seed=3)
    tok = AutoTokenizer.from_pretrained(path)
    model = BertForMaskedLM.from_pretrained(path).eval()
    return model, tok


def _examples(tok, texts=SENTENCES):
    return [tok(s, return_special_tokens_mask=False) for s in texts]


def _content_counts(tok, texts=SENTENCES) -> list[int]:
    return [len(tok(s, add_special_tokens=False)["input_ids"]) for s in texts]


# ---------------------------------------------------------------------- masking
@pytest.mark.parametrize("estimator", ["random-size", "fixed-rate"])
def test_masks_exactly_m_maskable_tokens(tiny, estimator):
    _, tok = tiny
    coll = DataCollatorForMPT(tok, estimator=estimator, seed=0)
    ex = _examples(tok)
    clean = tok.pad(ex, return_tensors="pt")["input_ids"]
    special = torch.isin(clean, torch.tensor(tok.all_special_ids))
    dcount = torch.tensor(_content_counts(tok))
    for _ in range(50):
        b = coll(ex)
        masked = b["mpt_labels"] != -100
        m = masked.sum(1)
        assert not (masked & special).any(), "a special or padding position was masked"
        assert (m >= 1).all() and (m <= dcount).all()
        torch.testing.assert_close(b["mpt_weights"], (dcount / m).float())
        assert torch.equal(b["mpt_labels"][masked], clean[masked])
        assert (b["input_ids"][masked] == tok.mask_token_id).all()  # pure [MASK]
        assert torch.equal(b["input_ids"][~masked], clean[~masked])
        assert torch.equal(b["attention_mask"], (clean != tok.pad_token_id).long())
        if estimator == "fixed-rate":
            assert m.tolist() == [fixed_rate_size(0.15, int(d)) for d in dcount]


def test_random_sizes_span_one_to_d_uniformly(tiny):
    _, tok = tiny
    text = SENTENCES[-1]
    d = _content_counts(tok, [text])[0]
    coll = DataCollatorForMPT(tok, seed=1)
    b = coll(_examples(tok, [text] * 3000))
    m = (b["mpt_labels"] != -100).sum(1)
    counts = torch.bincount(m, minlength=d + 1)
    assert counts[0] == 0 and counts[1:].min() > 0, "some size in 1..D never drawn"
    # chi-square against U{1..D}: far below the 0.1% point for D - 1 degrees of freedom
    expected = 3000 / d
    chi2 = float(((counts[1:] - expected) ** 2 / expected).sum())
    assert chi2 < d - 1 + 5 * math.sqrt(2 * (d - 1))


def test_stratified_sizes_cover_every_stratum():
    g = torch.Generator().manual_seed(0)
    for d in (1, 7, 40):
        m = create("random-size", stratified=True).sizes(torch.full((d,), d), generator=g)
        assert sorted(m.tolist()) == list(range(1, d + 1))  # B = D: a permutation of 1..D
    # marginally still uniform on 1..D_i for ragged D_i
    d = torch.tensor([3, 10, 1, 6] * 2000)
    m = create("random-size", stratified=True).sizes(d, generator=g)
    assert ((m >= 1) & (m <= d)).all()
    for di in (3, 10, 6):
        sel = m[d == di]
        torch.testing.assert_close(sel.double().mean(), torch.tensor((di + 1) / 2,
                                   dtype=torch.float64), atol=5 * math.sqrt(
                                   (di * di - 1) / 12 / sel.numel()), rtol=0)


def test_special_tokens_mask_empty_sequences_and_lists(tiny):
    _, tok = tiny
    coll = DataCollatorForMPT(tok, seed=0)
    ids = tok("the cat sat")["input_ids"]  # [CLS] the cat sat [SEP]
    stm = [1, 1, 0, 0, 1]  # also protect "the"
    b = coll([{"input_ids": ids, "special_tokens_mask": stm},
              {"input_ids": ids[:1] + ids[-1:], "special_tokens_mask": [1, 1]}])
    assert "special_tokens_mask" not in b
    masked = b["mpt_labels"] != -100
    assert not masked[0, :2].any() and masked[0].sum() >= 1
    assert b["mpt_weights"][0] == 2 / masked[0].sum()
    assert not masked[1].any() and b["mpt_weights"][1] == 0  # D = 0: the empty sum
    # plain lists of ids and tensors work like dicts
    b2 = DataCollatorForMPT(tok, seed=0)([ids, torch.tensor(ids)])
    assert b2["input_ids"].shape == (2, 5) and "attention_mask" in b2
    with pytest.raises(ValueError, match="example 1 has fields"):
        coll([{"input_ids": ids, "special_tokens_mask": stm}, {"input_ids": ids}])


def test_bert_corruption_80_10_10(tiny):
    _, tok = tiny
    coll = DataCollatorForMPT(tok, estimator="fixed-rate", rate=0.5, corruption="bert", seed=2)
    ex = _examples(tok, [SENTENCES[-1]] * 4000)
    clean = tok.pad(ex, return_tensors="pt")["input_ids"]
    b = coll(ex)
    masked = b["mpt_labels"] != -100
    x, y = b["input_ids"][masked], clean[masked]
    n = masked.sum().item()
    frac_mask = (x == tok.mask_token_id).double().mean().item()
    frac_same = (x == y).double().mean().item()
    changed = x[(x != y) & (x != tok.mask_token_id)]
    assert abs(frac_mask - 0.8) < 5 * math.sqrt(0.16 / n)
    # unchanged: the 10% kept plus random draws that hit the true token (1/24 of 10%)
    assert abs(frac_same - (0.1 + 0.1 / 24)) < 5 * math.sqrt(0.1 / n)
    assert not torch.isin(changed, torch.tensor(tok.all_special_ids)).any()
    assert torch.equal(b["input_ids"][~masked], clean[~masked])


def test_seed_reproducible_and_arguments_refused(tiny):
    _, tok = tiny
    ex = _examples(tok)
    a, b = DataCollatorForMPT(tok, seed=5)(ex), DataCollatorForMPT(tok, seed=5)(ex)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="rate applies"):
        DataCollatorForMPT(tok, rate=0.2)
    with pytest.raises(ValueError, match="stratified"):
        DataCollatorForMPT(tok, estimator="fixed-rate", stratified=True)
    with pytest.raises(ValueError, match="estimator"):
        DataCollatorForMPT(tok, estimator="bernoulli")
    with pytest.raises(ValueError, match="rate"):
        DataCollatorForMPT(tok, estimator="fixed-rate", rate=1.5)
    with pytest.raises(ValueError, match="corruption"):
        DataCollatorForMPT(tok, corruption="random")
    with pytest.raises(ValueError, match="mpt_weights"):
        mpt_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long), torch.ones(3))
    with pytest.raises(ValueError, match="mpt_weights"):
        mpt_batch_loss(tiny[0], {"input_ids": a["input_ids"], "mpt_labels": a["mpt_labels"]})


# ---------------------------------------------------------------------- the loss
def test_loss_is_weighted_sum_of_the_scorers_conditionals(tiny):
    """Per sequence: mpt_loss = -(D/M) sum_{j in mask} log p(x_j | x_R), as MaskedLM scores it."""
    model, tok = tiny
    mlm = MaskedLM(model, tok)
    coll = DataCollatorForMPT(tok, seed=4)
    ex = _examples(tok)
    b = coll(ex)
    with torch.no_grad():
        terms = mpt_batch_loss(model, b, reduction="none")
    content = [torch.tensor(tok(s, add_special_tokens=False)["input_ids"]) for s in SENTENCES]
    masks = [(b["mpt_labels"][i, 1:1 + len(c)] != -100) for i, c in enumerate(content)]
    lc = mlm.log_conditionals([c.tolist() for c in content], masks)
    ref = torch.stack([-(len(c) / m.sum()) * v.sum() for c, m, v in zip(content, masks, lc,
                                                                      strict=True)])
    torch.testing.assert_close(terms.double(), ref.double(), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(mpt_batch_loss(model, b), terms.mean())


def _loss_draws(model, coll, ex, reps: int) -> torch.Tensor:
    """(reps,) batch-mean losses, each over a fresh draw of sizes and masks for all of ``ex``."""
    out = []
    with torch.no_grad():
        for _ in range(0, reps, 300):
            b = coll(ex * 300)
            out.append(mpt_batch_loss(model, b, reduction="none").double().view(300, -1))
    return torch.cat(out)[:reps].mean(1)


def _mean_and_se(est) -> tuple[float, float]:
    """Mean over sequences of a MaskedLM LML estimate and its Monte Carlo standard error.

    The MLM result has the same fields as PPCA's: ``mean`` and ``stderr`` (Monte Carlo,
    sqrt(sum of per-sequence SE^2) / N).
    """
    return float(est.mean), float(est.stderr)


def test_weighted_loss_is_unbiased_for_the_mpt_sum(tiny):
    """E[collator loss] = -(cumulative LML estimate), within 4 combined standard errors.

    Negative control: the fixed-rate (15%) loss, a biased estimate of the same
    quantity, is more than 4 standard errors away on the same random model.
    """
    model, tok = tiny
    ex = _examples(tok)
    est = estimate_lml(MaskedLM(model, tok), SENTENCES, "cumulative", num_masks=32, seed=0)
    lml_mean, lml_se = _mean_and_se(est)

    def z_of(coll: DataCollatorForMPT) -> tuple[float, str]:
        d = _loss_draws(model, coll, ex, 2400)
        mean, se = float(d.mean()), float(d.std() / math.sqrt(d.numel()))
        return ((mean + lml_mean) / math.hypot(se, lml_se),
                f"loss {mean:.3f}+/-{se:.3f} vs -LML {-lml_mean:.3f}+/-{lml_se:.3f}")

    z, msg = z_of(DataCollatorForMPT(tok, seed=7))
    assert abs(z) < 4, msg
    z, msg = z_of(DataCollatorForMPT(tok, stratified=True, seed=8))
    assert abs(z) < 4, "stratified: " + msg
    z, msg = z_of(DataCollatorForMPT(tok, estimator="fixed-rate", seed=9))
    assert abs(z) > 4, "the fixed-rate loss should be biased here: " + msg


# ---------------------------------------------------------------------- random orders
def test_chain_rule_matches_a_hand_written_random_order(tiny):
    """estimate_lml(mlm, ., "chain-rule") = mean over orders of sum_t log q(x_pi(t) | x_pi(t+1..D)).

    Orders are drawn per sequence from round 0 of its engine stream (seed, i), like
    every ragged mask; here they are scored one prefix mask at a time through
    ``log_conditionals`` (every masked position scored), keeping pi(t).
    """
    model, tok = tiny
    mlm = MaskedLM(model, tok)
    # six tokens each: 2 orders (12 masked inputs) are fewer than the 63 masks of a sequence,
    # so the orders are drawn (a sequence of at most 4 tokens would be scored exactly)
    seqs = tok(["the cat sat on a mat", "a big dog ran far away"],
               add_special_tokens=False)["input_ids"]
    est = estimate_lml(mlm, seqs, "chain-rule", num_masks=2, seed=5)
    want = torch.zeros(2, dtype=torch.float64)
    per_order = torch.zeros(2, 2, dtype=torch.float64)
    for i, s in enumerate(seqs):
        d = len(s)
        # round 0 of sequence i's stream (5, i) on the engine, as CellDraw seeds it
        orders = distinct_orders(d, 2, torch.Generator().manual_seed(
            spawn(round_seed((5, i), 0), 0)))
        assert not torch.equal(orders[0], orders[1])  # without replacement from the 6! orders
        lc = mlm.log_conditionals([s], [prefix_masks(orders).reshape(2 * d, d)])[0]
        for q in range(2):
            per_order[i, q] = sum(lc[q * d + t, int(orders[q, t])] for t in range(d))
        want[i] = per_order[i].mean()
    torch.testing.assert_close(est.per_sample, want, rtol=1e-5, atol=1e-5)
    se = per_order.std(dim=1) / 2 ** 0.5 * (1 - 2 / math.factorial(6)) ** 0.5  # the fpc
    torch.testing.assert_close(est.per_sample_stderr, se, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="special"):
        estimate_lml(mlm, torch.tensor([[tok.cls_token_id, 5]]), "chain-rule", seed=0)


def test_ragged_chain_rule_and_cumulative_agree_in_expectation(tiny):
    """E_pi log q_pi(x) = sum_M S(x; M) for any conditionals: two estimators, one quantity."""
    model, tok = tiny
    mlm = MaskedLM(model, tok)
    seqs = SENTENCES  # 2-6 tokens: every mask fewer than the draws, both exact; 15: drawn
    chain = estimate_lml(mlm, seqs, "chain-rule", num_masks=60, seed=11)
    cum = estimate_lml(mlm, seqs, "cumulative", num_masks=60, seed=12)
    lengths = [len(t) for t in mlm.encode(seqs)]
    exact = (chain.per_sample_stderr == 0) & (cum.per_sample_stderr == 0)
    assert exact.tolist() == [d <= 6 for d in lengths]
    # where both enumerate, both are the exhaustive sum: equal
    torch.testing.assert_close(chain.per_sample[exact], cum.per_sample[exact], rtol=0,
                               atol=1e-9)
    z = (chain.per_sample - cum.per_sample)[~exact] / torch.sqrt(
        chain.per_sample_stderr ** 2 + cum.per_sample_stderr ** 2)[~exact]
    assert bool((z.abs() < 4.5).all()), z
    # every mask of an exact sequence once; 60 orders of D prefixes each for the drawn one
    assert chain.num_masked_rows == sum(2 ** d - 1 if d <= 6 else 60 * d for d in lengths)


def test_ragged_chain_rule_refuses_what_it_does_not_use(tiny):
    model, tok = tiny
    mlm = MaskedLM(model, tok)
    with pytest.raises(TypeError, match="rates"):
        estimate_lml(mlm, ["the cat"], "chain-rule", rates=[0.5])


def test_random_order_samples_follow_the_conditionals(tiny):
    model, tok = tiny
    mlm = MaskedLM(model, tok)
    allowed = tok.convert_tokens_to_ids(["cat", "dog", "tree"])
    x = sample_random_order(mlm, 3000, 1, allowed_ids=allowed, generator=0)
    assert x.shape == (3000, 1) and set(x.flatten().tolist()) <= set(allowed)
    # one position: the draw is the model's conditional given nothing, renormalised on allowed
    with torch.no_grad():
        inp = torch.tensor([[tok.cls_token_id, tok.mask_token_id, tok.sep_token_id]])
        p = torch.softmax(model(input_ids=inp).logits[0, 1, allowed], -1).double()
    counts = torch.tensor([(x == a).sum().item() for a in allowed], dtype=torch.float64)
    chi2 = float(((counts - 3000 * p) ** 2 / (3000 * p)).sum())
    assert chi2 < 2 + 5 * 2.0, f"chi2={chi2:.1f} with 2 degrees of freedom"
    a = sample_random_order(mlm, 4, 6, generator=3)
    assert torch.equal(a, sample_random_order(mlm, 4, 6, generator=3))
    assert not torch.isin(a, torch.tensor(tok.all_special_ids)).any()


# ---------------------------------------------------------------------- Trainer
def test_trainer_five_steps_lower_the_loss(tiny, tmp_path):
    from transformers import BertForMaskedLM, TrainingArguments

    from mptlml.hf import MPTTrainer

    model0, tok = tiny
    model = BertForMaskedLM(model0.config)
    model.load_state_dict(model0.state_dict())
    train = _examples(tok) * 4
    probe = DataCollatorForMPT(tok, seed=11)(_examples(tok) * 40)

    def probe_loss() -> float:
        model.eval()
        with torch.no_grad():
            return float(mpt_batch_loss(model, probe))

    before = probe_loss()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=10,
                             max_steps=5, learning_rate=5e-3, report_to=[], use_cpu=True,
                             save_strategy="no", logging_steps=1, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = MPTTrainer(model=model, args=args, train_dataset=train,
                         data_collator=DataCollatorForMPT(tok, seed=0))
    out = trainer.train()
    assert out.global_step == 5 and math.isfinite(out.training_loss)
    after = probe_loss()
    assert after < before, f"5 MPT steps did not lower the loss: {before:.3f} -> {after:.3f}"
    with pytest.raises(ValueError, match="mpt_weights"):
        trainer.compute_loss(model, {"input_ids": probe["input_ids"],
                                     "mpt_labels": probe["mpt_labels"]})


# ---------------------------------------------------------------------- size-rule conformance
def _rule(name, sizes_fn, weights_fn=None):
    """A user's estimator with the given per-sequence size rule (not registered)."""
    from mptlml.estimators import RandomSize

    def weights(self, sizes, num_tokens):
        if weights_fn is None:
            return RandomSize.weights(self, sizes, num_tokens)
        return weights_fn(sizes, num_tokens)

    cls = type(name, (RandomSize,), {"name": name,
                                      "sizes": lambda self, d, **kw: sizes_fn(d),
                                      "weights": weights})
    return cls()


@pytest.mark.parametrize("sizes_fn, weights_fn, match", [
    (lambda d: d + 1, None, "drew M=.* only .* tokens can be masked"),
    (lambda d: torch.zeros_like(d), None, "M=0 .* a mask of 0 tokens scores nothing"),
    (lambda d: d.double(), None, "integer tensor"),
    (lambda d: d.clone(), lambda m, d: torch.full(m.shape, float("nan")), "weights.. gave nan"),
    (lambda d: d.clone(), lambda m, d: -d.double(), r"weights.. gave -\d"),
])
def test_collator_refuses_a_size_rule_that_breaks_the_contract(tiny, sizes_fn, weights_fn,
                                                               match):
    """Before: M > D_i masked D_i tokens weighted D_i/M_i; M = 0, NaN or negative weights
    trained silently (MPTTrainer reported training_loss 0.0 with NaN parameters)."""
    _, tok = tiny
    coll = DataCollatorForMPT(tok, estimator=_rule("user-rule", sizes_fn, weights_fn), seed=0)
    with pytest.raises(ValueError, match=match):
        coll(_examples(tok))


def test_estimate_refuses_a_size_rule_that_breaks_the_contract():
    """The same check guards the estimators' own draws (dense data)."""
    from mptlml.models import PPCA

    model = PPCA.random(5, 2, sigma2=0.3, seed=0)
    x = model.sample(4, generator=0)
    bad = _rule("too-big", lambda d: torch.full((1,), 9))
    bad.sizes = lambda d, num_data=None, generator=None: torch.full((1, num_data), 9)
    with pytest.raises(ValueError, match="M=9 .* D=5"):
        estimate_lml(model, x, bad, seed=0)


def test_collator_refuses_estimator_options_it_would_not_use(tiny):
    """Before: num_masks=4 and share_masks=True of an instance were silently dropped."""
    _, tok = tiny
    with pytest.raises(ValueError, match="num_masks=4, which it would not use"):
        DataCollatorForMPT(tok, estimator=create("random-size", num_masks=4))
    with pytest.raises(ValueError, match="share_masks=True, which it would not use"):
        DataCollatorForMPT(tok, estimator=create("random-size", share_masks=True))


def test_collator_names_labels_and_text_fields(tiny):
    """Before: transformers' "activate truncation and/or padding" for both."""
    _, tok = tiny
    ex = [dict(tok(s)) for s in SENTENCES[:2]]
    with pytest.raises(ValueError, match="'labels' field: the collator makes its own targets"):
        DataCollatorForMPT(tok, seed=0)([{**e, "labels": e["input_ids"]} for e in ex])
    with pytest.raises(ValueError, match="text field 'text'"):
        DataCollatorForMPT(tok, seed=0)([{**e, "text": s} for e, s in zip(ex, SENTENCES,
                                                                          strict=False)])


@pytest.mark.slow  # chi-square over thousands of collated batches: over 3 s each
@pytest.mark.parametrize("estimator", ["random-size", "adaptive-size"])
def test_every_stratified_size_draw_per_position(tiny, estimator):
    """Stratified sizes through the collator, per sequence whatever its batch position.

    A batch of B sequences of one length D: the B uniforms cover the B quantile
    strata once each (#{i: M_i <= m} is floor or ceil of B cdf(m) in every batch),
    and every position, over draws, sees each size with probability q(M) (its
    stratum is random: a position tied to one stratum would fail the chi-square).
    """
    _, tok = tiny
    text = SENTENCES[0]
    d = _content_counts(tok, [text])[0]
    b = 4
    coll = DataCollatorForMPT(tok, estimator=estimator, stratified=True, seed=3)
    q = (torch.full((d,), 1.0 / d, dtype=torch.float64) if estimator == "random-size"
         else coll.size_rule.size_probs(d))
    cdf = q.cumsum(0)
    ex = _examples(tok, [text] * b)
    reps = 2000
    sizes = torch.stack([(coll(ex)["mpt_labels"] != -100).sum(1) for _ in range(reps)])
    below = (sizes[:, :, None] <= torch.arange(1, d + 1)).sum(1).double()
    assert ((below >= torch.floor(b * cdf - 1e-9)) & (below <= torch.ceil(b * cdf + 1e-9))).all()
    from scipy import stats

    for i in range(b):
        counts = torch.bincount(sizes[:, i], minlength=d + 1)[1:].double()
        assert stats.chisquare(counts.numpy(), (q * reps).numpy()).pvalue > 1e-3, i
