"""Training by MPT cannot quietly become something else (issue 23).

A plain ``Trainer`` refuses the MPT batches; gradient accumulation over unequal
micro-batches gives the full-batch mean; a resumed run equals the uninterrupted
one; evaluation neither changes the training masks nor its own between calls;
DataLoader workers and epochs draw distinct masks; the arguments that would
train another objective are refused.
"""

from __future__ import annotations

import math

import pytest
import torch

from mptlml.hf import DataCollatorForMPT, mpt_loss

from .mlm_helpers import SENTENCES, make_tiny_bert

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer

    path = make_tiny_bert(tmp_path_factory.mktemp("hf") / "bert", seed=5)
    return path, AutoTokenizer.from_pretrained(path)


def _model(path):
    """The tiny BERT without dropout: its gradients are a function of the masks alone."""
    from transformers import BertForMaskedLM

    return BertForMaskedLM.from_pretrained(path, hidden_dropout_prob=0.0,
                                           attention_probs_dropout_prob=0.0)


def _args(out, **kw):
    from transformers import TrainingArguments

    base = dict(output_dir=str(out), per_device_train_batch_size=2, learning_rate=1e-2,
                report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
                dataloader_num_workers=0, disable_tqdm=True)
    return TrainingArguments(**{**base, **kw})


def _examples(tok, texts=SENTENCES):
    return [dict(tok(s)) for s in texts]


# ---------------------------------------------------------------------- plain Trainer
@pytest.mark.slow
def test_a_plain_trainer_cannot_train_the_unweighted_loss(tiny, tmp_path):
    """Before: Trainer + DataCollatorForMPT trained BERT's unweighted mean silently."""
    from transformers import Trainer

    path, tok = tiny
    model = _model(path)
    coll = DataCollatorForMPT(tok, seed=0)
    batch = coll(_examples(tok))
    assert "labels" not in batch and model(**batch).get("loss") is None
    trainer = Trainer(model=model, args=_args(tmp_path, max_steps=1), data_collator=coll,
                      train_dataset=_examples(tok))
    with pytest.raises(TypeError, match="plain Trainer.* mptlml.hf.MPTTrainer"):
        trainer.train()  # before: transformers' generic "did not return a loss"


# ---------------------------------------------------------------------- accumulation
@pytest.mark.slow
def test_accumulation_over_unequal_micro_batches_is_the_full_batch_mean(tiny, tmp_path):
    """3 + 2 sequences, accumulated: the update is the gradient of the mean over the 5.

    Before: each micro-batch's mean was divided by the 2 accumulation steps,
    (mean_3 + mean_2) / 2, a gradient off by ~20%.
    """
    from transformers import TrainerCallback

    from mptlml.hf import MPTTrainer

    path, tok = tiny
    model = _model(path)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    seen: list[dict] = []
    grads: dict[str, torch.Tensor] = {}

    class Recording(MPTTrainer):
        def compute_loss(self, model, inputs, **kw):
            seen.append({k: v.detach().cpu().clone() for k, v in inputs.items()})
            return super().compute_loss(model, inputs, **kw)

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters()
                          if p.grad is not None})

    args = _args(tmp_path, per_device_train_batch_size=3, gradient_accumulation_steps=2,
                 max_steps=1, max_grad_norm=0.0, optim="sgd", lr_scheduler_type="constant")
    Recording(model=model, args=args, data_collator=DataCollatorForMPT(tok, seed=1),
              train_dataset=_examples(tok), callbacks=[Grads()]).train()
    assert [b["input_ids"].shape[0] for b in seen] == [3, 2]

    ref = _model(path)
    ref.load_state_dict(init)
    ref.train()
    total = sum(mpt_loss(ref(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                             token_type_ids=b["token_type_ids"]).logits,
                         b["mpt_labels"], b["mpt_weights"], reduction="sum") for b in seen)
    (total / 5).backward()
    assert grads.keys() == {n for n, p in ref.named_parameters() if p.grad is not None}
    for n, p in ref.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-7, msg=n)


# ---------------------------------------------------------------------- resume, evaluation
def _trained(path, tok, out, *, resume=None, **kw):
    from mptlml.hf import MPTTrainer

    model = _model(path)
    data = _examples(tok, SENTENCES + SENTENCES[:1])  # 6 sequences: 3 steps per epoch
    trainer = MPTTrainer(model=model, args=_args(out, max_steps=5, **kw),
                         data_collator=DataCollatorForMPT(tok, seed=3), train_dataset=data,
                         eval_dataset=_examples(tok))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_resume_is_exact_and_evaluation_changes_no_training_mask(tiny, tmp_path):
    """5 steps straight (evaluating after each) == 2 steps, saved, resumed to 5 (no evaluation).

    Before: the collator's private generator restarted on resume (the masks
    diverged), and every evaluation drew from the training generator.
    """
    path, tok = tiny
    full, a = _trained(path, tok, tmp_path / "a", save_strategy="steps", save_steps=2,
                       eval_strategy="steps", eval_steps=1)
    _, b = _trained(path, tok, tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-2"))
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the same masks at every evaluation: eval_loss changes only with the model
    e1, e2 = full.evaluate()["eval_loss"], full.evaluate()["eval_loss"]
    assert e1 == e2 and math.isfinite(e1)


@pytest.mark.slow
def test_masks_do_not_depend_on_dataloader_workers(tiny, tmp_path):
    path, tok = tiny
    _, a = _trained(path, tok, tmp_path / "a")
    _, b = _trained(path, tok, tmp_path / "b", dataloader_num_workers=2)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_plain_dataloader_workers_and_epochs_draw_distinct_masks(tiny):
    """Before: workers were seeded seed + worker id at every epoch: every epoch repeated."""
    _, tok = tiny
    ex = _examples(tok, [SENTENCES[-1]] * 8)
    loader = torch.utils.data.DataLoader(ex, batch_size=2, num_workers=2,
                                         collate_fn=DataCollatorForMPT(tok, seed=0))

    def epochs(seed):
        torch.manual_seed(seed)
        return [[b["mpt_labels"] for b in loader] for _ in range(2)]

    e = epochs(0)
    assert not any(torch.equal(x, y) for x, y in zip(e[0], e[1], strict=True))
    assert not torch.equal(e[0][0], e[0][1])  # worker 0 and worker 1, same sequences
    again = epochs(0)  # reproducible given torch's seed
    assert all(torch.equal(x, y) for ep, ep2 in zip(e, again, strict=True)
               for x, y in zip(ep, ep2, strict=True))


# ---------------------------------------------------------------------- refusals
def test_arguments_that_change_the_objective_are_refused(tiny, tmp_path):
    from transformers import DataCollatorForLanguageModeling

    from mptlml.hf import MPTTrainer

    path, tok = tiny
    model, coll = _model(path), DataCollatorForMPT(tok)
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        MPTTrainer(model=model, args=_args(tmp_path, label_smoothing_factor=0.1),
                   data_collator=coll)
    with pytest.raises(ValueError, match="compute_loss_func"):
        MPTTrainer(model=model, args=_args(tmp_path), data_collator=coll,
                   compute_loss_func=lambda *a, **k: 0)
    with pytest.raises(TypeError, match="DataCollatorForMPT"):
        MPTTrainer(model=model, args=_args(tmp_path),
                   data_collator=DataCollatorForLanguageModeling(tok))
    with pytest.raises(ValueError, match="eval_num_draws"):
        MPTTrainer(model=model, args=_args(tmp_path), data_collator=coll, eval_num_draws=0)


def test_mlm_probability_is_the_fixed_rate(tiny):
    _, tok = tiny
    ex = _examples(tok)
    a = DataCollatorForMPT(tok, estimator="fixed-rate", mlm_probability=0.3, seed=2)(ex)
    b = DataCollatorForMPT(tok, estimator="fixed-rate", rate=0.3, seed=2)(ex)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="estimator='fixed-rate'"):
        DataCollatorForMPT(tok, mlm_probability=0.15)
    with pytest.raises(ValueError, match="one of the two"):
        DataCollatorForMPT(tok, estimator="fixed-rate", rate=0.15, mlm_probability=0.15)


def test_pad_to_multiple_of_is_validated(tiny):
    _, tok = tiny
    for bad in (0, -8, 2.5, True, "8"):
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            DataCollatorForMPT(tok, pad_to_multiple_of=bad)
    b = DataCollatorForMPT(tok, pad_to_multiple_of=8, seed=0)(_examples(tok))
    assert b["input_ids"].shape[1] % 8 == 0


def test_unknown_token_floods_are_refused_by_the_collator(tiny, tmp_path):
    """Before: [UNK] is never masked, so an all-[UNK] batch trained on a zero loss."""
    from transformers import BertTokenizer

    _, tok = tiny
    coll = DataCollatorForMPT(tok, seed=0)
    with pytest.raises(ValueError, match="unknown token"):
        coll(_examples(tok, ["xyzzy plugh qwerty", "the cat"]))  # 3 of 5 tokens are [UNK]
    with pytest.warns(UserWarning, match="unknown token"):
        DataCollatorForMPT(tok, seed=0, allow_unknown=True)(_examples(tok, ["xyzzy plugh"]))
    # a lower-casing tokenizer on an upper-case vocabulary: refused up front, as MaskedLM does
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "THE", "CAT",
                                "SAT", "ON", "MAT"]) + "\n")
    with pytest.raises(ValueError, match="unknown token"):
        DataCollatorForMPT(BertTokenizer(str(vocab), do_lower_case=True))


def test_token_scores_to_pandas(tiny):
    from mptlml import pll
    from mptlml.models import MaskedLM

    path, tok = tiny
    mlm = MaskedLM(_model(path), tok)
    res = pll(mlm, SENTENCES[:2], per_token=True)
    df = res.to_pandas()
    assert len(df) == sum(len(t) for t in res.tokens)
    assert list(df.columns[:5]) == ["datum", "position", "token", "log_prob", "model"]
    assert df.groupby("datum")["log_prob"].sum().tolist() == pytest.approx(res.total.tolist())


# ---------------------------------------------------------------------- data MPTTrainer refuses
def test_data_without_a_maskable_token_is_refused_before_training(tiny, tmp_path):
    """Before: all-empty data trained nothing and reported training_loss 0.0 / eval_loss 0.0."""
    from mptlml.hf import MPTTrainer

    path, tok = tiny
    model = _model(path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    empty = _examples(tok, ["", ""])  # [CLS] [SEP] only
    trainer = MPTTrainer(model=model, args=_args(tmp_path, max_steps=2, weight_decay=0.1),
                         data_collator=DataCollatorForMPT(tok, seed=0), train_dataset=empty,
                         eval_dataset=empty)
    with pytest.raises(ValueError, match="training dataset .2 examples. has no maskable token"):
        trainer.train()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="evaluation dataset .2 examples. has no maskable"):
        trainer.evaluate()
    # one non-empty sequence is enough (scanned up to it)
    MPTTrainer(model=model, args=_args(tmp_path, max_steps=1),
               data_collator=DataCollatorForMPT(tok, seed=0),
               train_dataset=empty + _examples(tok, SENTENCES[:1])).train()


def test_a_batch_longer_than_the_position_table_is_named(tmp_path):
    """Before: a tensor-size mismatch from inside the embeddings."""
    from transformers import AutoTokenizer

    from mptlml.hf import MPTTrainer

    path = make_tiny_bert(tmp_path / "short", seed=5, max_position_embeddings=8)
    tok = AutoTokenizer.from_pretrained(path)
    trainer = MPTTrainer(model=_model(path), args=_args(tmp_path / "out", max_steps=1),
                         data_collator=DataCollatorForMPT(tok, seed=0),
                         train_dataset=_examples(tok, [SENTENCES[-1]] * 2))
    length = len(tok(SENTENCES[-1])["input_ids"])  # > 8 positions
    with pytest.raises(ValueError, match=f"inputs of {length} tokens .* position table covers 8"):
        trainer.train()


def test_each_process_masks_its_micro_batches_from_its_own_reproducible_stream(tiny):
    """(seed, step, micro-batch, process) seeds the masks: processes differ, reruns agree."""
    from types import SimpleNamespace

    from mptlml.hf import MPTTrainer

    _, tok = tiny
    coll = DataCollatorForMPT(tok, seed=0)
    batch = coll.pad(_examples(tok, [SENTENCES[-1]] * 8))

    def masks(rank):
        fake = SimpleNamespace(model=None, mpt_collator=coll, mask_seed=11,
                               args=SimpleNamespace(process_index=rank))
        return MPTTrainer._mask(fake, batch, 0, 3, 0)["mpt_labels"] != -100

    assert torch.equal(masks(0), masks(0)) and torch.equal(masks(1), masks(1))
    assert not torch.equal(masks(0), masks(1))
