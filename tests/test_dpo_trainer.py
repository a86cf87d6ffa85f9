"""``MPTDPOTrainer`` (issue 41): exact accumulation, exact resume, a frozen reference, the logs.

Tiny BERTs saved to temporary directories; no download.
"""

from __future__ import annotations

import math

import pytest
import torch

from .mlm_helpers import make_tiny_bert

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PAIRS = [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in [
    ("the cat", " sat on a mat", " ran far away"),
    ("a dog", " ran far", " was under the big tree"),
    ("the red house", " and a tree", " is blue"),
    ("a big", " dog sat", " cat"),
    ("the", " small red house", " or a mat"),
    ("blue", " tree", " mat and the cat sat"),
]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    path = make_tiny_bert(tmp_path_factory.mktemp("dpo") / "bert", seed=5)
    return path, AutoTokenizer.from_pretrained(path)


def _model(path):
    from transformers import BertForMaskedLM

    return BertForMaskedLM.from_pretrained(path)


def _args(out, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=str(out), per_device_train_batch_size=2, learning_rate=1e-2,
                report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
                dataloader_num_workers=0, disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


def _trainer(path, tok, args, **kw):
    from mptlml.hf import MPTDPOTrainer

    return MPTDPOTrainer(model=_model(path), args=args, train_dataset=kw.pop("data", PAIRS),
                         processing_class=tok, beta=0.5, num_masks=2, exact_length=1, **kw)


def test_accumulation_is_the_full_batch_step(tiny, tmp_path):
    """2 micro-batches of 2 pairs accumulated == one batch of 4: the same masks, loss, grads."""
    from transformers import TrainerCallback

    path, tok = tiny
    grads: list[dict[str, torch.Tensor]] = []

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()
                          if p.grad is not None})

    losses = []
    for bs, ga in ((4, 1), (2, 2)):
        tr = _trainer(path, tok, _args(tmp_path / f"{bs}", per_device_train_batch_size=bs,
                                       gradient_accumulation_steps=ga, max_steps=1,
                                       max_grad_norm=0.0, optim="sgd"),
                      callbacks=[Grads()])
        losses.append(tr.train().training_loss)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7, msg=n)


def test_resume_gives_the_uninterrupted_run_and_the_reference_stays_frozen(tiny, tmp_path):
    """4 steps straight == 2 steps, saved, resumed to 4 (the learned allocation included)."""
    path, tok = tiny
    a = _trainer(path, tok, _args(tmp_path / "a", max_steps=4, save_strategy="steps",
                                  save_steps=2))
    ref0 = {k: v.clone() for k, v in a.ref_lm.model.state_dict().items()}
    a.train()
    b = _trainer(path, tok, _args(tmp_path / "b", max_steps=4))
    b.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    def losses(t):  # the resumed run's history holds the checkpoint's steps 1-2 first
        return {h["step"]: h["loss"] for h in t.state.log_history if "loss" in h}

    assert losses(a) == losses(b) and sorted(losses(a)) == [1, 2, 3, 4]
    sa, sb = a.model.state_dict(), b.model.state_dict()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert (a.spread_count == b.spread_count).all() and a.spread_count.sum() > 0
    # the reference: no gradient, no change
    assert all(p.grad is None and not p.requires_grad for p in a.ref_lm.model.parameters())
    for k, v in a.ref_lm.model.state_dict().items():
        assert torch.equal(v, ref0[k]), k


def test_the_logs_and_evaluation(tiny, tmp_path):
    path, tok = tiny
    tr = _trainer(path, tok, _args(tmp_path, max_steps=2, per_device_eval_batch_size=3),
                  eval_dataset=PAIRS)
    tr.train()
    first, log = [h for h in tr.state.log_history if "loss" in h]
    # step 1: the policy is its reference, and on common masks the margins are exactly 0
    assert first["rewards/margins"] == 0 and first["margin_mc_se"] == 0
    assert first["loss"] == pytest.approx(math.log(2))
    for k in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
              "rewards/margins_sd", "margin_mc_se", "logps/chosen", "logps/rejected"):
        assert math.isfinite(log[k]), k
    assert log["rewards/margins"] == pytest.approx(log["rewards/chosen"]
                                                   - log["rewards/rejected"])
    assert log["margin_mc_se"] > 0
    e1, e2 = tr.evaluate(), tr.evaluate()
    assert e1["eval_loss"] == e2["eval_loss"] and math.isfinite(e1["eval_loss"])
    assert 0 <= e1["eval_rewards/accuracies"] <= 1 and "eval_margin_mc_se" in e1


def test_bad_arguments_are_refused(tiny, tmp_path):
    from datasets import Dataset

    from mptlml.hf import MPTDPOTrainer

    path, tok = tiny
    model = _model(path)
    args = _args(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="ref_model is the model itself"):
        MPTDPOTrainer(model=model, ref_model=model, args=args, train_dataset=PAIRS,
                      processing_class=tok)
    with pytest.raises(ValueError, match=r"text columns \['prompt', 'chosen', 'rejected'\]"):
        MPTDPOTrainer(model=model, args=args, processing_class=tok,
                      train_dataset=Dataset.from_list([{"prompt": "a", "answer": "b"}]))
    with pytest.raises(ValueError, match="num_masks must be even"):
        MPTDPOTrainer(model=model, args=args, train_dataset=PAIRS, processing_class=tok,
                      num_masks=3)
    with pytest.raises(ValueError, match="allocation='learned' learns from"):
        MPTDPOTrainer(model=model, args=args, train_dataset=PAIRS, processing_class=tok,
                      masks="vrpo")


def test_a_datasets_dataset_trains(tiny, tmp_path):
    """TRL's format as a datasets.Dataset: its text columns are kept (not removed as unused)."""
    from datasets import Dataset

    path, tok = tiny
    tr = _trainer(path, tok, _args(tmp_path, max_steps=1), data=Dataset.from_list(PAIRS))
    assert math.isfinite(tr.train().training_loss)


def test_the_allocation_is_learned_from_the_steps_draws(tiny, tmp_path):
    """10 strata per response cover the 10 rate bins in step 1: from step 2 on, the density
    is Neyman's of the margin's spread by rate (density_of), no longer uniform."""
    import numpy as np

    from mptlml.estimators.sequential import density_of

    path, tok = tiny
    tr = _trainer(path, tok, _args(tmp_path, max_steps=2, per_device_train_batch_size=3))
    tr.num_masks = 20
    tr.train()
    assert (tr.spread_count > 0).all()
    np.testing.assert_allclose(tr.density.mass,
                               density_of(tr.spread_sum / tr.spread_count).mass)
    assert np.ptp(tr.density.mass) > 0.01


def test_a_masked_diffusion_module_with_a_plain_mask_id_trains(tmp_path):
    """A plain module (no config, no attention mask) and ``mask_token_id=``, as LLaDA's."""
    from mptlml.hf import MPTDPOTrainer

    from .diffusion_helpers import TinyDiffusionLM, make_word_tokenizer

    tok = make_word_tokenizer()
    model = TinyDiffusionLM(len(tok), seed=0)
    pairs = [{"prompt": "the cat", "chosen": " sat on a mat", "rejected": " ran far"},
             {"prompt": "a", "chosen": " big red tree", "rejected": " dog sat on the house"}]
    tr = MPTDPOTrainer(model=model, args=_args(tmp_path, max_steps=2), train_dataset=pairs,
                       processing_class=tok, num_masks=2, exact_length=1,
                       mask_token_id=tok.convert_tokens_to_ids("mdm_mask"))
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert all(m.dropout == 0 for m in model.modules()
               if isinstance(m, torch.nn.MultiheadAttention))
    tr.train()
    first, second = [h for h in tr.state.log_history if "loss" in h]
    assert first["loss"] == pytest.approx(math.log(2)) and math.isfinite(second["loss"])
    assert second["margin_mc_se"] > 0
