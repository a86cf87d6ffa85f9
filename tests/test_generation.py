"""LLaDA's sampler (issue 51): ``mptlml.generate`` against LLaDA's algorithm written here.

The reference below is LLaDA's ``generate`` (low-confidence remasking over semi-autoregressive
blocks) written directly on the module, one batch tensor, as its paper's Algorithm describes;
``mptlml.generate`` must give the same tokens at temperature 0, for a BERT (framed, attention
mask) and a plain module with a shifted head (Dream-style).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mptlml.hf import generate, transfer_counts
from mptlml.models import MaskedLM

from .diffusion_helpers import TinyDiffusionLM, make_word_tokenizer
from .mlm_helpers import make_tiny_bert

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def llada_reference(net, x_prompt, suffix, gen_length, steps, block_length, mask_id,
                    shift=False):
    """LLaDA's generate on a batch of equal-length framed prompts ``(B, P)``; ``(B, gen)`` out.

    As LLaDA's, but the mask id is never predicted (LLaDA's trained model never does; a
    random tiny model might).
    """
    b, p = x_prompt.shape
    x = torch.cat([x_prompt, torch.full((b, gen_length), mask_id),
                   suffix.expand(b, -1)], dim=1)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    for blk in range(num_blocks):
        lo, hi = p + blk * block_length, p + (blk + 1) * block_length
        num = (x[:, lo:hi] == mask_id).sum(1)
        ntt = torch.zeros(b, per_block, dtype=torch.long) + (num // per_block)[:, None]
        for j in range(b):
            ntt[j, :int(num[j] % per_block)] += 1
        for s in range(per_block):
            mask_index = x == mask_id
            with torch.no_grad():
                out = net(x)
                logits = (out if isinstance(out, torch.Tensor) else out.logits).double()
            if shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            x0 = logits.clone().index_fill_(-1, torch.tensor([mask_id]), -np.inf).argmax(-1)
            x0_p = torch.softmax(logits, -1).gather(-1, x0[..., None]).squeeze(-1)
            x0_p[:, hi:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            conf = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=torch.float64))
            for j in range(b):
                idx = torch.topk(conf[j], int(ntt[j, s])).indices
                x[j, idx] = x0[j, idx]
    return x[:, p:p + gen_length]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    from transformers import BertForMaskedLM, BertTokenizer

    path = make_tiny_bert(tmp_path_factory.mktemp("gen") / "b", seed=3)
    tok = BertTokenizer.from_pretrained(path)
    net = BertForMaskedLM.from_pretrained(path).double().eval()
    return net, tok, MaskedLM(net, tok)


def test_the_schedule_is_llada_s():
    assert transfer_counts(7, 3) == [3, 2, 2]
    assert transfer_counts(4, 4) == [1, 1, 1, 1]
    assert sum(transfer_counts(11, 4)) == 11


@pytest.mark.parametrize(("gen", "steps", "block"), [(6, 6, 6), (6, 4, 3), (8, 4, 2)])
def test_greedy_generation_equals_llada_s_algorithm_on_a_bert(bert, gen, steps, block):
    net, tok, lm = bert
    prompts = ["the cat sat", "a big dog"]  # three tokens each: one batch tensor
    x = torch.tensor([tok(p)["input_ids"][:-1] for p in prompts])  # [CLS] + prompt
    ref = llada_reference(net, x, torch.tensor([tok.sep_token_id]), gen, steps, block,
                          tok.mask_token_id)
    out = generate(lm, prompts, max_new_tokens=gen, steps=steps, block_length=block)
    assert torch.equal(torch.stack(out.ids), ref)
    assert out.forwards == len(prompts) * steps
    assert out.texts == [tok.decode(r.tolist(), skip_special_tokens=True) for r in ref]


def test_a_shifted_head_without_attention_mask_equals_llada_s_algorithm():
    tok = make_word_tokenizer()
    mask_id = tok.convert_tokens_to_ids("mdm_mask")
    net = TinyDiffusionLM(len(tok), seed=2, dropout=0.0).double().eval()
    lm = MaskedLM(net, tok, mask_token_id=mask_id, shift_logits=True)
    prompts = ["the cat", "a dog", "big red tree"]  # ragged: rows of one length per forward
    out = generate(lm, prompts, max_new_tokens=4, steps=4, block_length=2)
    for p, got in zip(prompts, out.ids, strict=True):
        x = torch.tensor([tok(p)["input_ids"]])
        ref = llada_reference(net, x, torch.zeros(0, dtype=torch.long), 4, 4, 2, mask_id,
                              shift=True)
        assert torch.equal(got, ref[0])


def test_ragged_prompts_in_one_batch_equal_each_alone(bert):
    _, _, lm = bert
    prompts = ["the cat sat on a", "blue", "a big dog ran"]
    batch = generate(lm, prompts, max_new_tokens=4, steps=4, block_length=2)
    for i, p in enumerate(prompts):
        alone = generate(lm, [p], max_new_tokens=4, steps=4, block_length=2)
        assert torch.equal(batch.ids[i], alone.ids[0])


def test_sampling_is_seeded_and_does_not_depend_on_the_batch(bert):
    _, _, lm = bert
    prompts = ["the cat", "the cat", "a dog"]
    a = generate(lm, prompts, max_new_tokens=6, temperature=1.0, seed=5)
    b = generate(lm, prompts, max_new_tokens=6, temperature=1.0, seed=5, batch_size=1)
    c = generate(lm, prompts, max_new_tokens=6, temperature=1.0, seed=6)
    assert all(torch.equal(u, v) for u, v in zip(a.ids, b.ids, strict=True))
    assert any(not torch.equal(u, v) for u, v in zip(a.ids, c.ids, strict=True))
    r = generate(lm, prompts, max_new_tokens=6, remasking="random", seed=1)
    assert all(len(ids) == 6 and (ids != lm.mask_token_id).all() for ids in r.ids)
    few = generate(lm, prompts, max_new_tokens=6, temperature=2.0, allowed_ids=[5, 6])
    assert all(set(ids.tolist()) <= {5, 6} for ids in few.ids)


def test_bad_arguments_are_refused(bert):
    _, _, lm = bert
    with pytest.raises(ValueError, match="multiple of block_length"):
        generate(lm, ["a"], max_new_tokens=6, block_length=4)
    with pytest.raises(ValueError, match="multiple of the 3 blocks"):
        generate(lm, ["a"], max_new_tokens=6, block_length=2, steps=4)
    with pytest.raises(ValueError, match="remasking"):
        generate(lm, ["a"], max_new_tokens=2, remasking="entropy")
    with pytest.raises(ValueError, match="temperature"):
        generate(lm, ["a"], max_new_tokens=2, temperature=-1)
    with pytest.raises(TypeError, match="single string"):
        generate(lm, "a", max_new_tokens=2)
    with pytest.raises(ValueError, match="allowed_ids"):
        generate(lm, ["a"], max_new_tokens=2, allowed_ids=[lm.mask_token_id])
    with pytest.raises(ValueError, match="over the model's"):
        generate(lm, ["a"], max_new_tokens=80)
