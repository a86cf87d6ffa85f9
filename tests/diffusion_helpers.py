"""Small masked-diffusion-style modules for the tests: plain ``nn.Module``s that return logits.

They are not transformers models: no ``config``, no tokenizer mask token. The mask id is
a plain vocabulary entry (as LLaDA's 126336), and the logits cover more ids than the
tokenizer knows (as LLaDA's 126,464 logits).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

WORDS = "the cat dog sat on a mat ran far away big small red blue house tree".split()
MASK_WORD = "mdm_mask"  # a plain vocabulary entry the modules read as "masked"
EXTRA_LOGITS = 3  # logits beyond the tokenizer's vocabulary


def make_word_tokenizer(path: Path | None = None):
    """A whitespace word-level fast tokenizer with no special tokens but [UNK] and [PAD]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", *WORDS, MASK_WORD])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")
    if path is not None:
        tok.save_pretrained(path)
    return tok


class TinyDiffusionLM(nn.Module):
    """A bidirectional one-layer transformer: ``forward(input_ids) -> logits`` (no attention mask).

    Without an attention mask the adapter may only batch inputs of one length.
    """

    def __init__(self, vocab_size: int, *, hidden: int = 16, seed: int = 0,
                 dropout: float = 0.3) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(64, hidden)
        self.layer = nn.TransformerEncoderLayer(hidden, 2, 32, dropout=dropout, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)
        for p in self.parameters():  # spread the conditionals: scores that differ by position
            nn.init.normal_(p, std=0.6)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.head(self.layer(self.embed(input_ids) + self.pos(t)))


class Output:
    """A forward output with ``.logits`` (as transformers' ModelOutput)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class IndependentLM(nn.Module):
    """Tokens independent of each other: p(x_j | x_R) = softmax(b)[x_j] whatever is visible.

    Its conditionals come from one joint, log p(x) = sum_j log softmax(b)[x_j], so the MPT
    sum equals it exactly, for every mask. Takes ``attention_mask``, returns ``.logits``.
    """

    def __init__(self, vocab_size: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.bias = nn.Parameter(torch.randn(vocab_size, generator=g, dtype=torch.float64))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> Output:
        return Output(self.bias.expand(*input_ids.shape, -1))

    def log_prob(self, ids: torch.Tensor) -> float:
        return float(torch.log_softmax(self.bias.detach(), -1)[ids].sum())


def direct_log_probs(module: nn.Module, ids: torch.Tensor, masked: torch.Tensor,
                     mask_id: int) -> torch.Tensor:
    """log p(x_j | x_{-masked}) at the masked positions, by one direct forward (the reference)."""
    x = ids.clone()
    x[masked] = mask_id
    module.eval()
    with torch.no_grad():
        out = module(input_ids=x[None])
        logits = out if isinstance(out, torch.Tensor) else out.logits
        lp = torch.log_softmax(logits[0].double(), -1)
    pos = masked.nonzero().flatten()
    return lp[pos, ids[pos]]


MODELING_CODE = '''
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class TinyMDMConfig(PretrainedConfig):
    model_type = "tiny_mdm"

    def __init__(self, vocab_size=24, hidden=16, **kwargs):
        self.vocab_size = vocab_size
        self.hidden = hidden
        super().__init__(**kwargs)


class TinyMDM(PreTrainedModel):
    config_class = TinyMDMConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.mix = nn.Linear(config.hidden, config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.8)

    def forward(self, input_ids, attention_mask=None):
        h = self.embed(input_ids)
        m = torch.ones_like(input_ids, dtype=h.dtype) if attention_mask is None else (
            attention_mask.to(h.dtype))
        ctx = (h * m[..., None]).sum(1, keepdim=True) / m.sum(1, keepdim=True)[..., None]
        return (self.head(torch.tanh(h + self.mix(ctx))),)
'''


def save_remote_code_model(path: Path, vocab_size: int, seed: int = 0) -> Path:
    """A checkpoint whose class lives in its own ``modeling_tiny_mdm.py`` (``trust_remote_code``).

    Its config names only ``AutoConfig`` and ``AutoModel`` in ``auto_map`` (no masked-LM
    class), as masked-diffusion LMs (LLaDA) ship theirs; its forward returns a tuple.
    """
    import importlib.util
    import json
    import sys

    path.mkdir(parents=True, exist_ok=True)
    (path / "modeling_tiny_mdm.py").write_text(MODELING_CODE)
    spec = importlib.util.spec_from_file_location("modeling_tiny_mdm_local",
                                                  path / "modeling_tiny_mdm.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["modeling_tiny_mdm_local"] = mod
    spec.loader.exec_module(mod)
    torch.manual_seed(seed)
    model = mod.TinyMDM(mod.TinyMDMConfig(vocab_size=vocab_size))
    model.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "modeling_tiny_mdm.TinyMDMConfig",
                       "AutoModel": "modeling_tiny_mdm.TinyMDM"}
    cfg.pop("architectures", None)
    (path / "config.json").write_text(json.dumps(cfg))
    make_word_tokenizer(path)
    return path


#: remote code written for transformers 4, in the three ways LLaDA's fails under transformers 5
OLD_MODELING_CODE = '''
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

POST_INIT = {post_init}
OLD_TIE = {old_tie}


class TinyOldConfig(PretrainedConfig):
    model_type = "tiny_old"

    def __init__(self, vocab_size=24, hidden=16, use_cache=False, **kwargs):
        self.vocab_size = vocab_size
        self.hidden = hidden
        super().__init__(use_cache=use_cache, **kwargs)  # kept by transformers 4 only


class TinyOld(PreTrainedModel):
    config_class = TinyOldConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.mix = nn.Linear(config.hidden, config.hidden)
        self.head = nn.Linear(config.hidden, config.vocab_size)
        if POST_INIT:
            self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.8)

    if OLD_TIE:
        def tie_weights(self):  # transformers 5 passes arguments
            pass
    else:
        def tie_weights(self, *args, **kwargs):
            pass

    def forward(self, input_ids, attention_mask=None):
        if self.config.use_cache:  # an AttributeError where the config lost it
            raise RuntimeError("no cache in a masked-diffusion forward")
        h = self.embed(input_ids)
        m = torch.ones_like(input_ids, dtype=h.dtype) if attention_mask is None else (
            attention_mask.to(h.dtype))
        ctx = (h * m[..., None]).sum(1, keepdim=True) / m.sum(1, keepdim=True)[..., None]
        return (self.head(torch.tanh(h + self.mix(ctx))),)
'''

#: which of LLaDA's failures each variant keeps
OLD_CODE_VARIANTS = {"no_post_init": (False, False), "old_tie_weights": (True, True),
                     "use_cache": (True, False)}


def save_old_remote_code_model(path: Path, variant: str, seed: int = 0) -> Path:
    """A remote-code checkpoint whose code predates transformers 5, as LLaDA's does.

    ``variant``: ``"no_post_init"`` (its model never calls ``post_init()``),
    ``"old_tie_weights"`` (``tie_weights(self)`` takes no argument) or ``"use_cache"``
    (its forward reads ``config.use_cache``, which transformers 5's config does not keep).
    Its ``config.json`` says it was saved by transformers 4.46.2, as such checkpoints do.
    """
    import importlib.util
    import json
    import sys

    post_init, old_tie = OLD_CODE_VARIANTS[variant]
    path.mkdir(parents=True, exist_ok=True)
    # the weights are written by code that runs under any transformers; the checkpoint then
    # ships the variant's code
    (path / "modeling_tiny_old.py").write_text(OLD_MODELING_CODE.format(post_init=True,
                                                                        old_tie=False))
    name = f"modeling_tiny_old_{variant}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path / "modeling_tiny_old.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    torch.manual_seed(seed)
    model = mod.TinyOld(mod.TinyOldConfig(vocab_size=len(WORDS) + 3))
    model.save_pretrained(path)
    (path / "modeling_tiny_old.py").write_text(OLD_MODELING_CODE.format(post_init=post_init,
                                                                        old_tie=old_tie))
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "modeling_tiny_old.TinyOldConfig",
                       "AutoModel": "modeling_tiny_old.TinyOld"}
    cfg.pop("architectures", None)
    cfg["transformers_version"] = "4.46.2"
    cfg["use_cache"] = False
    (path / "config.json").write_text(json.dumps(cfg))
    make_word_tokenizer(path)
    return path
