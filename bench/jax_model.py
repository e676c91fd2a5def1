"""bench/model.py's Llama-3-8B-shaped slice in JAX: flax linen, written the usual way.

The same two decoder-layer slices (attention projections with the attention replaced by
an elementwise product, SwiGLU FFN, RMSNorm, residuals), as `flax.linen` modules whose
`nn.Dense` layers differ only in their dot:

    training   jitted forward + backward (`jax.vjp` with a random cotangent) on x
               (2, T/2, dim): bf16 (`lax.dot_general`), lowp's
               `training_dot_general_cls(recipe)` with its defaults, flax's
               `fp8_ops.Fp8DirectDotGeneralOp` ("flax_fp8");
    inference  the jitted forward on x (1, T, dim): bf16, and lowp's quantized kernels
               (`lowp_jax.quantize_params` + `lowp_jax.linen.quantized(preset)`).

Every variant of one T is timed interleaved; compile time (lower + compile) is kept as
`first_call_s`. bench/run.py runs these as its "jax_model_train" and "jax_model_infer"
sections.
"""

import time

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import fp8_ops

import lowp_jax
import lowp_jax.linen
from bench import _timing
from bench.model import Shape

TRAIN_RECIPES = ("float8_tensorwise", "float8_rowwise")
INFER_PRESETS = ("float8_tensorwise", "float8_rowwise")


class Slice(nn.Module):
    shape: Shape
    dot: dict  # nn.Dense's dot_general_cls, or nothing: lax.dot_general

    def dense(self, features, name):
        return nn.Dense(
            features,
            use_bias=False,
            dtype=jnp.bfloat16,
            param_dtype=jnp.bfloat16,
            name=name,
            **self.dot,
        )

    @nn.compact
    def __call__(self, x):
        s = self.shape
        for i in range(s.layers):
            h = nn.RMSNorm(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, name=f"attn_norm{i}")(x)
            kv = self.dense(s.kv, f"k{i}")(h) * self.dense(s.kv, f"v{i}")(h)
            kv = jnp.repeat(kv, s.dim // s.kv, axis=-1)
            x = x + self.dense(s.dim, f"o{i}")(self.dense(s.dim, f"q{i}")(h) * kv)
            h = nn.RMSNorm(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, name=f"ffn_norm{i}")(x)
            gate = nn.silu(self.dense(s.ffn, f"w1_{i}")(h)) * self.dense(s.ffn, f"w3_{i}")(h)
            x = x + self.dense(s.dim, f"w2_{i}")(gate)
        return x


def dense_dot(variant: str) -> dict:
    """nn.Dense's dot arguments for a training variant."""
    if variant in ("bf16", "infer"):
        return {}
    if variant == "flax_fp8":
        return {"dot_general_cls": fp8_ops.Fp8DirectDotGeneralOp}
    if variant.startswith("lowp_"):
        recipe = variant.removeprefix("lowp_")
        return {"dot_general_cls": lowp_jax.training_dot_general_cls(recipe)}
    raise ValueError(f"unknown JAX model variant {variant!r}")


def train_variants() -> list[str]:
    return ["bf16", "flax_fp8"] + [f"lowp_{r}" for r in TRAIN_RECIPES]


def infer_variants() -> list[str]:
    return ["bf16"] + [f"lowp_{p}" for p in INFER_PRESETS]


def _compile_train(variant, s, x, dy):
    model = Slice(s, dense_dot(variant))
    variables = _halved(model.init(jax.random.key(0), x))

    def step(variables, x, dy):
        y, vjp = jax.vjp(model.apply, variables, x)
        return y, vjp(dy)

    return jax.jit(step).lower(variables, x, dy).compile(), (variables, x, dy)


def _compile_infer(variant, s, x):
    model = Slice(s, {})
    params = _halved(model.init(jax.random.key(0), x))
    if variant == "bf16":
        return jax.jit(model.apply).lower(params, x).compile(), (params, x)
    preset = variant.removeprefix("lowp_")
    params = lowp_jax.quantize_params(params, preset)

    def apply(params, x):
        with lowp_jax.linen.quantized(preset):
            return model.apply(params, x)

    return jax.jit(apply).lower(params, x).compile(), (params, x)


def _halved(variables):
    """nn.Dense's init, halved (bench/model.py's): the residual stream stays O(1)."""
    return jax.tree.map(lambda p: p * 0.5 if p.ndim == 2 else p, variables)


def measure(task: str, tokens: int, s: Shape, timing: _timing.Timing, on_error=None) -> list[dict]:
    """One row per variant of `task` ("train" or "infer") at `tokens` tokens, interleaved."""
    kx, kg = jax.random.split(jax.random.key(1))
    batch = 2 if task == "train" and tokens % 2 == 0 else 1
    x = jax.random.normal(kx, (batch, tokens // batch, s.dim), jnp.bfloat16)
    dy = jax.random.normal(kg, x.shape, jnp.bfloat16)
    variants = train_variants() if task == "train" else infer_variants()
    first_call_s = {}

    def build(variant):
        start = time.perf_counter()
        if task == "train":
            compiled, args = _compile_train(variant, s, x, dy)
        else:
            compiled, args = _compile_infer(variant, s, x)
        jax.block_until_ready(compiled(*args))
        first_call_s[variant] = time.perf_counter() - start
        return compiled, args

    kept, built = _timing.build_each(variants, build, on_error)
    outputs = [[] for _ in built]

    def runner(compiled, args, out):
        def call():
            out[:] = [compiled(*args)]

        return call

    measured = _timing.time_interleaved(
        [runner(c, a, o) for (c, a), o in zip(built, outputs, strict=True)],
        lambda: jax.block_until_ready(outputs),
        timing,
    )
    return [
        {
            "framework": "jax",
            "task": task,
            "T": tokens,
            "variant": variant,
            "mode": "jit",
            "ms": round(r.ms, 4),
            "first_call_s": round(first_call_s[variant], 2),
            "iters": r.iters,
        }
        for variant, r in zip(kept, measured, strict=True)
    ]
