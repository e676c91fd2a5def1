"""Which forms of a tensorwise fp8 dense layer XLA lowers to cuBLASLt's fp8 GEMM, and
how fast each runs, side by side in one run (bf16 x bf16, M = K = N = 8192 by default).

XLA folds scalar scales into cuBLASLt (scale_a / scale_b) when it finds its dequantize
pattern, a dot of `convert(fp8) * broadcast(scale)`. Measured on the H200 (jax 0.11.2,
2026-11-30): it does so when the fp8 codes are inputs of the computation ("c": 0.822 ms,
bf16 1.574), but with the activation quantized inside the same jit ("b", "bb" behind an
optimization barrier, "b16" in bf16) the dot runs as a float32 or bf16 GEMM instead
(3.20 / 3.33 / 1.71 ms). lowp_jax therefore feeds the codes straight into the dot ("a":
0.966 ms, its fp8 GEMM writing float32 and one fused pass scaling it), which rounds once.
"f" tries the pattern on the weight side only. "d" (bf16 GEMM output, then the scale)
rounds twice and is shown for speed only.

    python bench/jax_fp8_pattern.py            # 8192^3 on the GPU
    python bench/jax_fp8_pattern.py 256        # a CPU smoke run (no fp8 GEMM there)

To see the passes: XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_module_re=.*variant_b.*
--xla_dump_hlo_pass_re=.*" (the Triton GEMM fusion pass takes the dot in "b").
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp
import lowp_jax
from bench.jax_dense import time_ms

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
TS = lowp.TensorScaling()
DN = (((1,), (1,)), ((), ()))


def q(x):
    return lowp_jax.quantize(x, TS)


def deq(codes, scale, dt):
    return codes.astype(dt) * scale.astype(dt)


def variant_a(x, wc, ws):  # lowp today: f8 dot f32 out, scale, cast
    a = q(x)
    acc = lax.dot_general(a.codes, wc, DN, preferred_element_type=jnp.float32)
    return (acc * (a.scale * ws)).astype(jnp.bfloat16)


def variant_b(x, wc, ws):  # dequant pattern in f32, quantize in jit
    a = q(x)
    y = lax.dot_general(
        deq(a.codes, a.scale, jnp.float32),
        deq(wc, ws, jnp.float32),
        DN,
        preferred_element_type=jnp.float32,
    )
    return y.astype(jnp.bfloat16)


def variant_b16(x, wc, ws):  # dequant pattern in bf16, quantize in jit
    a = q(x)
    return lax.dot_general(
        deq(a.codes, a.scale, jnp.bfloat16),
        deq(wc, ws, jnp.bfloat16),
        DN,
        preferred_element_type=jnp.bfloat16,
    )


def variant_bb(x, wc, ws):  # dequant pattern f32, codes behind a barrier
    a = q(x)
    c, s = lax.optimization_barrier((a.codes, a.scale))
    y = lax.dot_general(
        deq(c, s, jnp.float32), deq(wc, ws, jnp.float32), DN, preferred_element_type=jnp.float32
    )
    return y.astype(jnp.bfloat16)


def variant_c(xc, xs, wc, ws):  # dequant pattern f32, operands are parameters
    y = lax.dot_general(
        deq(xc, xs, jnp.float32), deq(wc, ws, jnp.float32), DN, preferred_element_type=jnp.float32
    )
    return y.astype(jnp.bfloat16)


def variant_f(x, wc, ws):  # x codes converted without a scale, both scales on w
    a = q(x)
    y = lax.dot_general(
        a.codes.astype(jnp.float32),
        deq(wc, a.scale * ws, jnp.float32),
        DN,
        preferred_element_type=jnp.float32,
    )
    return y.astype(jnp.bfloat16)


def variant_d(x, wc, ws):  # f8 dot, bf16 out, then scale (rounds twice)
    a = q(x)
    acc = lax.dot_general(a.codes, wc, DN, preferred_element_type=jnp.bfloat16)
    return acc * (a.scale * ws).astype(jnp.bfloat16)


def variant_e(xc, xs, wc, ws):  # lowp's gemm part only
    acc = lax.dot_general(xc, wc, DN, preferred_element_type=jnp.float32)
    return (acc * (xs * ws)).astype(jnp.bfloat16)


def quant_only(x):
    a = q(x)
    return a.codes, a.scale


def bf16(x, w):
    return lax.dot_general(x, w, DN, preferred_element_type=jnp.bfloat16)


def main():
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (N, N), jnp.bfloat16)
    w = jax.random.normal(k2, (N, N), jnp.bfloat16)
    wq = q(w)
    xq = q(x)
    args3 = (x, wq.codes, wq.scale)
    args4 = (xq.codes, xq.scale, wq.codes, wq.scale)
    ref = jax.jit(variant_a)(*args3).astype(jnp.float32)
    rows = [("bf16", bf16, (x, w)), ("quantize", quant_only, (x,))]
    for name, fn, args in [
        ("a", variant_a, args3),
        ("b", variant_b, args3),
        ("b16", variant_b16, args3),
        ("bb", variant_bb, args3),
        ("c", variant_c, args4),
        ("d", variant_d, args3),
        ("e", variant_e, args4),
        ("f", variant_f, args3),
    ]:
        rows.append((name, fn, args))
    for name, fn, args in rows:
        j = jax.jit(fn)
        text = j.lower(*args).compile().as_text()
        f8 = "__cublas$lt$matmul$f8" in text
        ms = time_ms(j, args, iters=20)
        diff = ""
        if name in ["a", "b", "b16", "bb", "d", "f"]:
            out = j(*args).astype(jnp.float32)
            diff = (
                f" maxdiff_vs_a={float(jnp.max(jnp.abs(out - ref))):.4g} "
                f"equal={bool(jnp.all(out == ref))}"
            )
        print(f"{name:9s} {ms:8.3f} ms  fp8_gemm={f8}{diff}", flush=True)


if __name__ == "__main__":
    main()
