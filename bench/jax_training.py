"""One dense layer's forward + backward in JAX: bf16, each lowp recipe, flax's fp8.

Three `flax.linen.Dense` layers (bias-free, bfloat16 parameters and compute) that
differ only in their dot: the default `lax.dot_general` ("bf16"),
`lowp_jax.training_dot_general_cls(recipe)` ("lowp": current scaling, stateless) and
flax's `fp8_ops.Fp8DirectDotGeneralOp` ("flax_fp8": delayed scaling, an amax history
of 1024 in the `_overwrite_with_gradient` collection, which its backward "updates" by
returning the new state as a gradient). linen, because flax 0.12 has its fp8 ops as
linen modules only (`Fp8DotGeneralOp`, `Fp8DirectDotGeneralOp`, `NANOOFp8DotGeneralOp`;
no nnx equivalent).

The timed function is jitted `y, vjp = jax.vjp(apply, variables, x); vjp(dy)`, returning
y and every gradient, with a random cotangent dy: with `sum(y)` as the loss XLA turns
the backward GEMMs into reductions, and an unused y drops the forward GEMM. bf16,
flax's and lowp's float8 steps are timed side by side (`measure_interleaved`): the
H200's clocks under a sustained GEMM load drift over a run, and flax's row and lowp's
should see the same drift.
"""

import time

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen import fp8_ops

import lowp_jax
from bench import _timing

FP8_GEMM = "__cublas$lt$matmul$f8"


def make_dense(impl: str, recipe: str | None, n: int, small_shapes: str = "auto") -> nn.Dense:
    """A bias-free bf16 Dense of `n` features with the impl's dot; `small_shapes`:
    lowp's small-shape policy ("quantize" runs the recipe at any shape)."""
    if impl == "bf16":
        dot = {}
    elif impl == "lowp":
        dot = {
            "dot_general_cls": lowp_jax.training_dot_general_cls(recipe, small_shapes=small_shapes)
        }
    elif impl == "flax_fp8":
        dot = {"dot_general_cls": fp8_ops.Fp8DirectDotGeneralOp}
    else:
        raise ValueError(f"unknown dense impl {impl!r}")
    return nn.Dense(n, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, **dot)


def inputs(m: int, k: int, n: int) -> tuple:
    """x (M, K) and dy (M, N) in bfloat16, the same for every variant."""
    kx, kg = jax.random.split(jax.random.key(0))
    return (
        jax.random.normal(kx, (m, k), jnp.bfloat16),
        jax.random.normal(kg, (m, n), jnp.bfloat16),
    )


def compile_step(impl: str, recipe: str | None, tensors):
    """(compiled forward + backward, its arguments, compile seconds) of one variant."""
    x, dy = tensors
    dense = make_dense(impl, recipe, dy.shape[1])
    # Every variant gets the same kernel: init draws it from the same key.
    variables = dense.init(jax.random.key(1), x)

    def fwd_bwd(variables, x, dy):
        y, vjp = jax.vjp(dense.apply, variables, x)
        return y, vjp(dy)

    start = time.perf_counter()
    compiled = jax.jit(fwd_bwd).lower(variables, x, dy).compile()
    return compiled, (variables, x, dy), time.perf_counter() - start


def measure(impl: str, recipe: str | None, tensors, timing: _timing.Timing) -> dict:
    """One row: the median time of the jitted forward + backward."""
    return measure_interleaved([(impl, recipe)], tensors, timing)[0]


def measure_interleaved(variants, tensors, timing: _timing.Timing, on_error=None) -> list[dict]:
    """One row per (impl, recipe) variant, all timed side by side
    (`_timing.time_interleaved`), so that flax's row and lowp's see the same clocks.

    on_error(variant, exception): called for a variant that fails to compile or run,
    which then has no row while the others are timed; without it, the exception
    propagates."""
    x, dy = tensors
    (m, k), n = x.shape, dy.shape[1]

    def build(variant):
        step = compile_step(*variant, tensors)
        jax.block_until_ready(step[0](*step[1]))  # a failure to run belongs here too
        return step

    variants, steps = _timing.build_each(variants, build, on_error)
    outputs = [[] for _ in steps]

    def runner(compiled, args, out):
        def call():
            out[:] = [compiled(*args)]

        return call

    measured = _timing.time_interleaved(
        [runner(c, a, out) for (c, a, _), out in zip(steps, outputs, strict=True)],
        lambda: jax.block_until_ready(outputs),
        timing,
    )
    rows = []
    for (impl, recipe), (compiled, _, compile_s), result in zip(
        variants, steps, measured, strict=True
    ):
        row = {
            "M": m,
            "K": k,
            "N": n,
            "impl": impl,
            "recipe": recipe or impl,
            "ms": round(result.ms, 4),
            "tflops": round(6 * m * k * n / (result.ms * 1e-3) / 1e12, 2),
            "compile_s": round(compile_s, 2),
            "iters": result.iters,
            # How many cuBLASLt fp8 GEMMs XLA emitted: 3 for a fully fp8 recipe on a
            # GPU, 0 where the dots are emulated (CPU, MX on Hopper).
            "fp8_gemms_in_hlo": compiled.as_text().count(f'custom_call_target="{FP8_GEMM}"'),
        }
        if len(variants) > 1:
            row["timed_with"] = [
                f"{i} {r}" if r else i for i, r in variants if (i, r) != (impl, recipe)
            ]
        if impl == "lowp":
            row["numerics_only"] = row["fp8_gemms_in_hlo"] == 0
        rows.append(row)
    return rows


def format_row(row: dict) -> str:
    shape = f"{row['M']}x{row['K']}x{row['N']}"
    label = row["impl"] if row["impl"] != "lowp" else f"lowp {row['recipe']}"
    note = "  (numerics only: no fp8 GEMM)" if row.get("numerics_only") else ""
    return (
        f"{shape:>18} {label:>26}: {row['ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s "
        f"fp8 GEMMs={row['fp8_gemms_in_hlo']} (compile {row['compile_s']:.1f} s){note}"
    )
