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
    with pytest.raises(ValueError, match="allocation='neyman' learns from"):
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


_DP_SCRIPT = """
import json, os, sys
import torch
from transformers import AutoTokenizer, BertForMaskedLM, TrainingArguments
from mptlml.hf import MPTDPOTrainer

path, out, batch, accumulate = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pairs = json.loads(sys.argv[5])
tok = AutoTokenizer.from_pretrained(path)
args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch,
                         gradient_accumulation_steps=accumulate,
                         per_device_eval_batch_size=batch, max_steps=4, learning_rate=0.1,
                         optim="sgd", report_to=[], use_cpu=True, save_strategy="steps",
                         save_steps=2, logging_steps=1, seed=0, dataloader_num_workers=0,
                         disable_tqdm=True)
tr = MPTDPOTrainer(model=BertForMaskedLM.from_pretrained(path), args=args, train_dataset=pairs,
                   eval_dataset=pairs[:6], processing_class=tok, beta=0.5, num_masks=20,
                   exact_length=1)
tr.train()
ev = tr.evaluate()
rank = tr.args.process_index
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"world_size": tr.args.world_size, "spread_sum": tr.spread_sum.tolist(),
               "spread_count": tr.spread_count.tolist(), "density": tr.density.mass.tolist(),
               "logs": tr.state.log_history, "eval": ev}, f)
if rank == 0:
    torch.save({k: v.cpu() for k, v in tr.model.state_dict().items()},
               os.path.join(out, "weights.pt"))
"""

_DP_PAIRS = [*PAIRS, {"prompt": "a red", "chosen": " cat sat on the mat", "rejected": " tree"},
             {"prompt": "the big", "chosen": " house", "rejected": " dog ran under a tree"}]


@pytest.mark.slow
@pytest.mark.xdist_group("launchers")  # one launcher at a time (ports)
def test_two_processes_train_as_one(tiny, tmp_path):
    """torchrun, 2 CPU processes (gloo) x 2 pairs, and 2 processes x 2 accumulated
    micro-batches of 1 pair, == 1 process x 4 pairs: the same masks (seeded by each pair's
    place among all the step's pairs), the same logged losses and metrics, the same
    evaluation, the same final weights and one allocation, learned from the draws of both
    processes and equal on each (and in the checkpoints).

    SGD, not Adam: Adam divides by the root of the gradient's second moment, so a weight
    whose gradient is 0 in exact arithmetic (an attention key bias: softmax ignores a shift)
    takes lr-sized steps on float rounding noise, which differs between the two runs."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import mptlml

    path, _ = tiny
    script = tmp_path / "dpo_dp.py"
    script.write_text(_DP_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(mptlml.__file__).resolve().parents[1]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    runs = {}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2"]
    for name, launch, batch, accumulate in (("one", [sys.executable], 4, 1),
                                            ("two", torchrun, 2, 1),
                                            ("two_accumulated", torchrun, 1, 2)):
        out = tmp_path / name
        p = subprocess.run([*launch, str(script), str(path), str(out), str(batch),
                            str(accumulate), json.dumps(_DP_PAIRS)], env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs[name] = out
    for name in ("two", "two_accumulated"):
        _assert_trains_as_one(runs["one"], runs[name])


def _assert_trains_as_one(run_one, run_two):
    """The 2-process run ``run_two`` trained as the 1-process run ``run_one``."""
    import json

    import numpy as np

    runs = {"one": run_one, "two": run_two}
    one = json.loads((runs["one"] / "rank0.json").read_text())
    two = [json.loads((runs["two"] / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert one["world_size"] == 1 and two[0]["world_size"] == 2
    # one allocation on both processes, learned from every pair's draws: the 1-process one;
    # the runs differ by float32 rounding only (other padded batches, gradients summed in
    # another order): log-probability sums of ~-20 nats agree to ~1e-6 absolute, so the
    # logged figures do to ~1e-5 and the spreads (squared differences of policy - reference
    # terms that nearly cancel) to ~1e-4 relative
    for k in ("spread_sum", "spread_count", "density"):
        assert two[0][k] == two[1][k], k
    assert two[0]["spread_count"] == one["spread_count"]
    np.testing.assert_allclose(two[0]["spread_sum"], one["spread_sum"], rtol=1e-4)
    np.testing.assert_allclose(two[0]["density"], one["density"], rtol=0, atol=1e-5)
    assert np.ptp(one["density"]) > 0.01  # learned, not uniform
    for step in ("checkpoint-2", "checkpoint-4"):
        saved = [json.loads((runs[n] / step / "mpt_dpo_allocation.json").read_text())
                 for n in ("one", "two")]
        np.testing.assert_allclose(saved[1]["spread_sum"], saved[0]["spread_sum"], rtol=1e-4)
        assert saved[1]["spread_count"] == saved[0]["spread_count"]

    def logs(run):
        return {h["step"]: h for h in run["logs"] if "loss" in h}

    a, b = logs(one), logs(two[0])
    assert sorted(a) == sorted(b) == [1, 2, 3, 4]
    for s in a:
        for k in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
                  "rewards/margins", "rewards/margins_sd", "margin_mc_se", "logps/chosen",
                  "logps/rejected", "grad_norm"):
            assert b[s][k] == pytest.approx(a[s][k], rel=1e-5, abs=1e-5), (s, k)
    for k, v in one["eval"].items():
        if k.startswith("eval_") and not k.endswith(("runtime", "per_second")):
            assert two[0]["eval"][k] == pytest.approx(v, rel=1e-5, abs=1e-5), k
    wa = torch.load(runs["one"] / "weights.pt")
    wb = torch.load(runs["two"] / "weights.pt")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-6, msg=k)


def test_the_dataset_is_checked_once_before_training_row_by_row(tiny, tmp_path):
    """Every bad row is named by its index in the dataset (not a place in a batch), at
    construction; rows whose chosen and rejected tokenise identically are dropped, counted."""
    from datasets import Dataset

    path, tok = tiny
    args = _args(tmp_path, max_steps=1)
    bad = [(4, {"chosen": None}, "row 4 of the training dataset: 'chosen' is a NoneType"),
           (5, {"rejected": ""}, "row 5 of the training dataset: .*no token of its own"),
           (2, {"prompt": 3.5}, "row 2 of the training dataset: 'prompt' is a float"),
           (1, "the cat", "row 1 of the training dataset must hold")]
    for i, change, message in bad:
        rows = [dict(p) for p in PAIRS]
        rows[i] = change if isinstance(change, str) else {**rows[i], **change}
        with pytest.raises((ValueError, TypeError), match=message):
            _trainer(path, tok, args, data=rows)
    with pytest.raises(ValueError, match="row 3 of the evaluation 'b' dataset"):
        _trainer(path, tok, args, eval_dataset={"a": PAIRS, "b": [*PAIRS[:3], {
            **PAIRS[3], "chosen": ["x"]}]})
    tr = _trainer(path, tok, args)
    with pytest.raises(ValueError, match="row 1 of the evaluation dataset: 'rejected' is a "
                                         "NoneType"):
        tr.evaluate(eval_dataset=[PAIRS[0], {**PAIRS[1], "rejected": None}])
    ties = [*PAIRS, {"prompt": "the cat", "chosen": " sat", "rejected": " sat"},
            {"prompt": "a", "chosen": " big  dog", "rejected": " big dog"}]  # same tokens
    for data in (ties, Dataset.from_list(ties)):
        with pytest.warns(UserWarning, match=r"2 of 8 rows of the training dataset have "
                                             r"identical chosen and rejected responses "
                                             r"\(rows \[6, 7\]\).*dropped"):
            tr = _trainer(path, tok, args, data=data)
        assert len(tr.train_dataset) == len(PAIRS)
        assert [r["chosen"] for r in tr.train_dataset] == [p["chosen"] for p in PAIRS]
    with pytest.raises(ValueError, match="every row of the training dataset has identical"), \
            pytest.warns(UserWarning, match="2 of 2 rows"):
        _trainer(path, tok, args, data=ties[-2:])


TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}a {% endif %}"
            "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}a {% endif %}")


def test_trls_conversational_format_goes_through_the_chat_template(tiny, tmp_path):
    """Rows of {"role", "content"} messages: taken through the tokenizer's chat template as
    TRL does (the prompt with its generation prompt; a response as the templated prompt +
    response past the templated prompt), or refused by name when there is none."""
    import copy

    from datasets import Dataset

    path, tok = tiny
    conv = [{"prompt": [{"role": "user", "content": p["prompt"]}],
             "chosen": [{"role": "assistant", "content": p["chosen"].strip()}],
             "rejected": [{"role": "assistant", "content": p["rejected"].strip()}]}
            for p in PAIRS]
    args = _args(tmp_path, max_steps=1)
    for data in (conv, Dataset.from_list(conv)):
        with pytest.raises(ValueError, match="row 0 of the training dataset is in TRL's "
                                             "conversational format.*no chat template"):
            _trainer(path, tok, args, data=data)
    templated = copy.deepcopy(tok)
    templated.chat_template = TEMPLATE
    for data in (conv, Dataset.from_list(conv)):
        tr = _trainer(path, templated, args, data=data)
        first = tr.train_dataset[0]
        assert first == {"prompt": PAIRS[0]["prompt"] + " a ",
                         "chosen": PAIRS[0]["chosen"].strip() + " ",
                         "rejected": PAIRS[0]["rejected"].strip() + " "}
    assert math.isfinite(tr.train().training_loss)
    mixed = [dict(conv[0], chosen=" sat"), *conv[1:]]
    with pytest.raises(ValueError, match="row 0 of the training dataset: 'chosen' is not a "
                                         "list of"):
        _trainer(path, templated, args, data=mixed)


def test_a_loss_that_is_not_finite_stops_training_before_the_weights_move(tiny, tmp_path):
    """NaN logits of the policy, or of the reference: training stops with a message at the
    first step, and no weight has become NaN (the step's optimizer never ran)."""
    path, tok = tiny
    for which in ("policy", "reference"):
        broken = _model(path)
        with torch.no_grad():
            broken.cls.predictions.decoder.bias[7] = float("nan")
        kw = {"ref_model": broken} if which == "reference" else {}
        tr = _trainer(path, tok, _args(tmp_path / which, max_steps=2, logging_nan_inf_filter=True),
                      **kw)
        if which == "policy":
            with torch.no_grad():
                tr.model.cls.predictions.decoder.bias[7] = float("nan")
        before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
        with pytest.raises(FloatingPointError, match="loss of step 0 is not finite"):
            tr.train()
        for n, p in tr.model.named_parameters():
            assert torch.equal(p.detach(), before[n], ) or bool(torch.isnan(before[n]).any()), n
        assert all(bool(torch.isfinite(p).all()) for n, p in tr.model.named_parameters()
                   if "decoder.bias" not in n and n != "cls.predictions.bias")


def test_every_logged_quantity_is_recomputed_from_the_step_s_bounds(tiny, tmp_path):
    """Each step's logs against the bounds it drew, recomputed here: rewards (beta (B_pi -
    B_ref), per response, mean over the pairs), accuracies, margins and their spread, the
    policy's bounds, the loss (mean -log sigmoid m) and margin_mc_se, the SE of the step's
    mean margin sqrt(sum_i se_i^2) / B (not the root-mean-square of the pairs' SEs, which is
    sqrt(B) times larger). A reference from another seed makes every quantity non-zero."""
    import numpy as np

    path, tok = tiny
    from transformers import BertForMaskedLM

    ref = BertForMaskedLM.from_pretrained(make_tiny_bert(tmp_path / "ref", seed=9))
    tr = _trainer(path, tok, _args(tmp_path / "out", max_steps=2,
                                   per_device_train_batch_size=3), ref_model=ref)
    seen = []
    record = tr._record

    def keep(split, b, step):
        seen.append(b)
        record(split, b, step)

    tr._record = keep
    tr.train()
    logs = [h for h in tr.state.log_history if "loss" in h]
    assert len(logs) == len(seen) == 2
    beta = tr.beta
    for b, log in zip(seen, logs, strict=True):
        pw = b.policy_chosen.detach().double().numpy()
        pl = b.policy_rejected.detach().double().numpy()
        rw, rl = b.ref_chosen.double().numpy(), b.ref_rejected.double().numpy()
        cw, cl = beta * (pw - rw), beta * (pl - rl)
        m = cw - cl
        se = np.asarray(b.margin_se, dtype=np.float64)
        assert len(m) == 3 and (se > 0).any()
        np.testing.assert_allclose(m, b.margin.detach().double().numpy(), rtol=1e-6)
        want = {"rewards/chosen": cw.mean(), "rewards/rejected": cl.mean(),
                "rewards/accuracies": float((m > 0).mean()), "rewards/margins": m.mean(),
                "rewards/margins_sd": m.std(ddof=1), "logps/chosen": pw.mean(),
                "logps/rejected": pl.mean(),
                "margin_mc_se": math.sqrt(float((se ** 2).sum())) / len(m)}
        for k, v in want.items():
            assert log[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
        assert log["margin_mc_se"] != pytest.approx(math.sqrt(float((se ** 2).mean())))
        loss = float(torch.nn.functional.softplus(-torch.from_numpy(m)).mean())
        assert log["loss"] == pytest.approx(loss, rel=1e-3, abs=1e-4)
