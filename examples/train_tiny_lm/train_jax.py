"""The tiny LM in JAX (flax nnx + optax): bf16, or a lowp recipe on the block projections.

    python examples/train_tiny_lm/train_jax.py [--runs bf16,mxfp8] [--size tiny]
        [--steps N] [--device gpu] [--json OUT]

The twin of `train_torch.py`: the same model, weights, batches, schedule and precision
(`tinylm.py`), written with flax's own layers. A recipe's projections are
`nnx.Linear(dot_general=lowp_jax.TrainingDotGeneral(recipe))`.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tinylm
from flax import nnx

import lowp_jax
import lowp_jax.nnx

BF16 = jnp.bfloat16


def _dense(in_features: int, out_features: int, run: str, rngs) -> nnx.Linear:
    """A bias-free projection: bf16 for the baseline, else quantized by the recipe `run`."""
    if run == "bf16":
        return nnx.Linear(in_features, out_features, use_bias=False, dtype=BF16, rngs=rngs)
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=False,
        dtype=BF16,
        # "quantize": the runs compare the recipes' numerics, and on a GPU the default
        # small-shape policy would keep these small layers in high precision.
        dot_general=lowp_jax.TrainingDotGeneral(tinylm.recipe_of(run), small_shapes="quantize"),
        # The float32 kernel itself is quantized, as lowp_torch.Linear does under autocast.
        promote_dtype=lowp_jax.nnx.master_weight_promote_dtype,
        rngs=rngs,
    )


class Attention(nnx.Module):
    def __init__(self, cfg: tinylm.Config, run: str, rngs):
        self.heads = cfg.heads
        self.qkv = _dense(cfg.d_model, 3 * cfg.d_model, run, rngs)
        self.proj = _dense(cfg.d_model, cfg.d_model, run, rngs)

    def __call__(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads)
        q, k, v = jnp.moveaxis(qkv, 2, 0)  # each (b, t, heads, head_dim)
        # bf16 products, float32 scores and softmax, as train_torch under autocast.
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * (d // self.heads) ** -0.5
        causal = jnp.tril(jnp.ones((t, t), bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(BF16), v).reshape(b, t, d)
        return self.proj(out)


class MLP(nnx.Module):
    def __init__(self, cfg: tinylm.Config, run: str, rngs):
        self.fc1 = _dense(cfg.d_model, 4 * cfg.d_model, run, rngs)
        self.fc2 = _dense(4 * cfg.d_model, cfg.d_model, run, rngs)

    def __call__(self, x):
        return self.fc2(jax.nn.gelu(self.fc1(x).astype(jnp.float32), approximate=False))


class MoE(nnx.Module):
    """Top-k routed SwiGLU experts (`tinylm` module docstring), as train_torch's."""

    def __init__(self, cfg: tinylm.Config, run: str, rngs):
        self.top_k, self.experts_n = cfg.top_k, cfg.experts
        self.router = nnx.Linear(cfg.d_model, cfg.experts, use_bias=False, rngs=rngs)
        recipe = None if run == "bf16" else tinylm.recipe_of(run)
        self.experts = lowp_jax.nnx.GroupedExperts(
            cfg.d_model, 2 * cfg.d_model, cfg.experts, recipe=recipe, rngs=rngs
        )

    def __call__(self, x):
        b, t, d = x.shape
        flat = x.reshape(-1, d).astype(jnp.float32)
        probs = jax.nn.softmax(self.router(flat), axis=-1)
        gates, expert = jax.lax.top_k(probs, self.top_k)
        gates = gates / gates.sum(-1, keepdims=True)
        order = jnp.argsort(expert.reshape(-1), stable=True)
        token = order // self.top_k
        counts = jnp.bincount(expert.reshape(-1), length=self.experts_n).astype(jnp.int32)
        y = self.experts(flat[token].astype(BF16), counts)
        weighted = y.astype(jnp.float32) * gates.reshape(-1)[order, None]
        return jnp.zeros_like(flat).at[token].add(weighted).reshape(b, t, d)


class Block(nnx.Module):
    def __init__(self, cfg: tinylm.Config, run: str, rngs):
        # torch's LayerNorm epsilon, not flax's 1e-6.
        self.ln1 = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, rngs=rngs)
        self.ln2 = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, rngs=rngs)
        self.attn = Attention(cfg, run, rngs)
        if cfg.ffn == "moe":
            self.moe = MoE(cfg, run, rngs)
        else:
            self.mlp = MLP(cfg, run, rngs)

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        return x + (self.moe if hasattr(self, "moe") else self.mlp)(self.ln2(x))


class TinyLM(nnx.Module):
    """The pre-LN byte-level decoder of `tinylm`; tokens (B, T) int -> logits (B, T, 256)."""

    def __init__(self, cfg: tinylm.Config, run: str, rngs):
        self.tok_emb = nnx.Embed(tinylm.VOCAB, cfg.d_model, rngs=rngs)
        self.pos_emb = nnx.Embed(cfg.seq_len, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List(Block(cfg, run, rngs) for _ in range(cfg.layers))
        self.ln_f = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, rngs=rngs)
        self.head = _dense(cfg.d_model, tinylm.VOCAB, "bf16", rngs)  # the head stays bf16

    def __call__(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb.embedding[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# --- parameters, by the torch state_dict names tinylm.init_params uses ---


def _slot(pure: dict, name: str) -> tuple[dict, str, bool]:
    """Where torch parameter `name` lives in a flax pure-dict state: the dict holding it,
    its key there, and whether its last two axes are swapped (flax kernels and
    ragged_dot's stacked experts are (in, out), torch Linear weights (out, in))."""
    *parents, leaf = [int(p) if p.isdigit() else p for p in name.split(".")]
    for p in parents:
        pure = pure[p]
    if parents[-1] in ("tok_emb", "pos_emb"):
        return pure, "embedding", False
    if parents[-1].startswith("ln"):
        return pure, "scale" if leaf == "weight" else "bias", False
    if parents[-1] == "experts":  # stacked (E, out, in) -> ragged_dot's (E, in, out)
        return pure, leaf, True
    return pure, "kernel", True


def load_params(model: nnx.Module, params: dict) -> None:
    """Put `tinylm.init_params`-style arrays (torch names and layouts) into `model`."""
    state = nnx.state(model, nnx.Param)
    pure = nnx.to_pure_dict(state)
    for name, value in params.items():
        node, leaf, transpose = _slot(pure, name)
        value = np.swapaxes(value, -1, -2) if transpose else value
        if node[leaf].shape != value.shape:
            raise ValueError(
                f"{name}: shape {value.shape} does not fit the flax shape {node[leaf].shape}"
            )
        node[leaf] = jnp.asarray(value)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)


def export_params(state: nnx.State, names) -> dict[str, np.ndarray]:
    """Copies of the arrays of torch parameters `names` in a model's Param state, in
    torch's layout (copies: a donated buffer may be reused by the next step)."""
    pure = nnx.to_pure_dict(state)
    out = {}
    for name in names:
        node, leaf, transpose = _slot(pure, name)
        out[name] = np.array(jnp.swapaxes(node[leaf], -1, -2) if transpose else node[leaf])
    return out


@functools.cache
def _optimizer(cfg: tinylm.Config) -> optax.GradientTransformation:
    """Clipping and AdamW at unit learning rate: the step scales the update by its own
    rate (`tinylm.learning_rates`), as train_torch sets it. One object per config, so
    every Trainer of a config shares the jitted step below instead of compiling its own."""
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.adamw(1.0, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay),
    )


def _loss(graphdef, state, tokens):
    logits = nnx.merge(graphdef, state)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), tokens[:, 1:]
    ).mean()


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(2, 3))
def _train_step(graphdef, tx, state, opt_state, tokens, lr):
    loss, grads = jax.value_and_grad(_loss, argnums=1)(graphdef, state, tokens)
    updates, opt_state = tx.update(grads, opt_state, state)
    updates = jax.tree.map(lambda u: lr * u, updates)
    return optax.apply_updates(state, updates), opt_state, loss


_eval_loss = jax.jit(_loss, static_argnums=0)


class Trainer:
    """One run's parameters and optax AdamW state; the interface `tinylm.train` drives.

    The step is a pure jitted function of (parameters, optimizer state, batch, learning
    rate): current scaling leaves nothing else to carry, so a checkpoint of the first
    two resumes exactly.

    device: "cpu" or "gpu".
    """

    def __init__(self, cfg: tinylm.Config, run: str, params: dict, device="cpu"):
        self.device = jax.devices(device)[0]
        # Built abstract (no random initialisation to run), then given `params`.
        model = nnx.eval_shape(lambda: TinyLM(cfg, run, nnx.Rngs(0)))
        load_params(model, params)
        self.names = tuple(params)
        self.graphdef, state = nnx.split(model, nnx.Param)
        self.tx, self.lrs = _optimizer(cfg), tinylm.learning_rates(cfg)
        self.state = jax.device_put(state, self.device)
        self.opt_state = jax.device_put(self.tx.init(self.state), self.device)

    def step(self, step: int, tokens: np.ndarray) -> float:
        self.state, self.opt_state, loss = _train_step(
            self.graphdef, self.tx, self.state, self.opt_state, self._put(tokens), self.lrs[step]
        )
        return float(loss)

    def eval_loss(self, tokens: np.ndarray) -> float:
        return float(_eval_loss(self.graphdef, self.state, self._put(tokens)))

    def _put(self, tokens: np.ndarray) -> jax.Array:
        return jax.device_put(tokens, self.device)

    def save(self, path) -> None:
        leaves = jax.tree.leaves((self.state, self.opt_state))
        with open(path, "wb") as f:
            np.savez(f, *[np.asarray(leaf) for leaf in leaves])

    def load(self, path) -> None:
        treedef = jax.tree.structure((self.state, self.opt_state))
        with np.load(path) as saved:
            leaves = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        self.state, self.opt_state = jax.device_put(
            jax.tree.unflatten(treedef, leaves), self.device
        )

    def params(self) -> dict[str, np.ndarray]:
        return export_params(self.state, self.names)


def deterministic() -> None:
    """XLA's deterministic GPU ops (scatter-adds without atomics, autotuning that picks
    the same GEMM each run). XLA_FLAGS is read when the backend starts: before any
    array exists, which is when `tinylm.cli` calls this."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()


if __name__ == "__main__":
    raise SystemExit(
        tinylm.cli("jax", Trainer, __doc__.splitlines()[0], deterministic=deterministic)
    )
