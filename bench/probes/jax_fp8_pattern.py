"""Which forms of a tensorwise fp8 dense layer XLA lowers to cuBLASLt's fp8 GEMM, and
how fast each runs, side by side in one run (bf16 x bf16, M = K = N = 8192 by default).

XLA folds scalar scales into cuBLASLt (scale_a / scale_b) when it finds its dequantize
pattern, a dot of `convert(fp8) * broadcast(scale)`. Measured on the H200 (jax 0.11.2,
2026-11-30): it does so when the fp8 codes are inputs of the computation ("c": 0.822 ms,
bf16 1.574), but with the activation quantized inside the same jit ("b", "bb" behind an
optimization barrier, "b16" in bf16) the dot ran as a float32 or bf16 GEMM instead
(3.20 / 3.33 / 1.71 ms), measured while quantize was XLA ops; with the Pallas cast
(since 476b3ed) "b" still ran as a Triton GEMM fusion (3.270 ms against "a" 0.892 ms,
2026-11-30). lowp_jax therefore feeds the codes straight into the dot ("a":
0.966 ms, its fp8 GEMM writing float32 and one fused pass scaling it), which rounds once.
"f" tries the pattern on the weight side only. "d" (bf16 GEMM output, then the scale
in bf16) rounds the scale as well and is shown for speed only. "g" writes bf16 and
scales in float32 (what lowp_jax tried for tensorwise operands, 2026-11-30: XLA gave
that dot to a Triton fusion at 2048x4096x4096 and the 8192^3 dense layer lost 3%);
"h" and "i" name the dot's fp8 algorithm (`lax.DotAlgorithmPreset`), to see whether
that keeps XLA on cuBLASLt with a bf16 output; "rows_a" / "rows_i" are lowp's rowwise
form and its bf16-output twin. Each row says which GEMM the compiled module runs.

    python bench/probes/jax_fp8_pattern.py            # 8192^3 on the GPU, every variant
    python bench/probes/jax_fp8_pattern.py --variants a,g,h,i,rows_a,rows_i   # the quick ones
    python bench/probes/jax_fp8_pattern.py 256        # a CPU smoke run (no fp8 GEMM there)

To see the passes: XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_module_re=.*variant_b.*
--xla_dump_hlo_pass_re=.*" (the Triton GEMM fusion pass takes the dot in "b").
"""

import argparse
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_jax
from bench.probes.jax_dense import time_ms

TS = lowp.TensorScaling()
ROWS = lowp.AxisScaling(pow2=True)
F8_F32_FAST = lax.DotAlgorithmPreset.ANY_F8_ANY_F8_F32_FAST_ACCUM
F8_ANY_FAST = lax.DotAlgorithmPreset.ANY_F8_ANY_F8_ANY_FAST_ACCUM
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


def variant_g(x, wc, ws):  # f8 dot, bf16 out, then the float32 scale, rounded again
    a = q(x)
    acc = lax.dot_general(a.codes, wc, DN, preferred_element_type=jnp.bfloat16)
    return (acc.astype(jnp.float32) * (a.scale * ws)).astype(jnp.bfloat16)


def variant_h(x, wc, ws):  # "a" with the fp8 dot algorithm named (float32 accumulation)
    a = q(x)
    acc = lax.dot_general(
        a.codes, wc, DN, precision=F8_F32_FAST, preferred_element_type=jnp.float32
    )
    return (acc * (a.scale * ws)).astype(jnp.bfloat16)


def variant_i(x, wc, ws):  # "g" with the fp8 dot algorithm named (any output type)
    a = q(x)
    acc = lax.dot_general(
        a.codes, wc, DN, precision=F8_ANY_FAST, preferred_element_type=jnp.bfloat16
    )
    return (acc.astype(jnp.float32) * (a.scale * ws)).astype(jnp.bfloat16)


def rows_a(x, wc, ws_rows):  # lowp's rowwise form: float32 out, row x column scales
    a = lowp_jax.quantize(x, ROWS)
    acc = lax.dot_general(a.codes, wc, DN, preferred_element_type=jnp.float32)
    return (acc * (a.scale * ws_rows.reshape(1, -1))).astype(jnp.bfloat16)


def rows_i(x, wc, ws_rows):  # rowwise, bf16 out with the algorithm named, then the scales
    a = lowp_jax.quantize(x, ROWS)
    acc = lax.dot_general(
        a.codes, wc, DN, precision=F8_ANY_FAST, preferred_element_type=jnp.bfloat16
    )
    return (acc.astype(jnp.float32) * (a.scale * ws_rows.reshape(1, -1))).astype(jnp.bfloat16)


def quant_only(x):
    a = q(x)
    return a.codes, a.scale


def bf16(x, w):
    return lax.dot_general(x, w, DN, preferred_element_type=jnp.bfloat16)


VARIANTS = {  # name -> (function, its arguments' kind, compared with "a" or "rows_a")
    "a": (variant_a, "x", "a"),
    "b": (variant_b, "x", "a"),
    "b16": (variant_b16, "x", "a"),
    "bb": (variant_bb, "x", "a"),
    "c": (variant_c, "codes", None),
    "d": (variant_d, "x", "a"),
    "e": (variant_e, "codes", None),
    "f": (variant_f, "x", "a"),
    "g": (variant_g, "x", "a"),
    "h": (variant_h, "x", "a"),
    "i": (variant_i, "x", "a"),
    "rows_a": (rows_a, "rows", "rows_a"),
    "rows_i": (rows_i, "rows", "rows_a"),
}


def gemm_kind(text: str) -> str:
    """How the compiled module runs its GEMM: cuBLASLt's fp8 GEMM (with its output
    type), a Triton GEMM fusion, or something else."""
    fp8 = re.findall(r"= \(?(\w+)\[[^\n]*__cublas\$lt\$matmul\$f8", text)
    if fp8:
        return "cublasLt-fp8->" + ",".join(fp8)
    if "xla.gpu.triton" in text or "triton_gemm" in text:
        return "triton-fusion"
    if "__cublas$gemm" in text or "__cublas$lt$matmul" in text:
        return "cublas (not fp8)"
    return "other"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=8192, help="M = K = N")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    args = parser.parse_args(argv)
    n = args.n
    k1, k2 = jax.random.split(jax.random.key(0))
    x = jax.random.normal(k1, (n, n), jnp.bfloat16)
    w = jax.random.normal(k2, (n, n), jnp.bfloat16)
    wq, xq, wr = q(w), q(x), lowp_jax.quantize(w, ROWS)
    inputs = {
        "x": (x, wq.codes, wq.scale),
        "codes": (xq.codes, xq.scale, wq.codes, wq.scale),
        "rows": (x, wr.codes, wr.scale),
    }
    refs = {
        "a": jax.jit(variant_a)(*inputs["x"]).astype(jnp.float32),
        "rows_a": jax.jit(rows_a)(*inputs["rows"]).astype(jnp.float32),
    }
    rows = [("bf16", bf16, (x, w), None), ("quantize", quant_only, (x,), None)]
    for name in args.variants.split(","):
        fn, kind, ref = VARIANTS[name]
        rows.append((name, fn, inputs[kind], ref))
    for name, fn, fn_args, ref in rows:
        j = jax.jit(fn)
        try:
            text = j.lower(*fn_args).compile().as_text()
            ms = time_ms(j, fn_args, iters=20)
        except Exception as e:  # noqa: BLE001 - an unsupported form is a result
            print(f"{name:9s} not run: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        diff = ""
        if ref is not None:
            out = j(*fn_args).astype(jnp.float32)
            diff = (
                f" maxdiff_vs_{ref}={float(jnp.max(jnp.abs(out - refs[ref]))):.4g} "
                f"equal={bool(jnp.all(out == refs[ref]))}"
            )
        print(f"{name:9s} {ms:8.3f} ms  gemm={gemm_kind(text)}{diff}", flush=True)


if __name__ == "__main__":
    main()
