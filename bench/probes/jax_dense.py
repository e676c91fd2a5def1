"""fp8 dense forward in JAX next to bf16, from one run.

For each shape (M, K, N): a bias-free flax `nnx.Linear(K, N)` in bfloat16, jitted, and
for each preset `lowp_jax.nnx.Linear` with the same kernel through
`lowp_jax.quantize_params` (an (N, K) QArray), jitted, on the same input. The quantized
forward includes quantizing the activation (dynamic scaling), as a model's would.
Each row gives milliseconds, TFLOP/s (2MKN / time), the speed ratio to bf16, the
`lowp_jax.dot_general` branch, and whether the compiled HLO calls cuBLASLt's fp8 GEMM.
Two more rows per preset say where the time goes: "gemm" (both operands already
quantized: the fp8 GEMM and its output scaling) and "quantize" (the activation's
quantization alone); one "raw gemm" row per shape is the ceiling: e4m3 codes straight
into `lax.dot_general` with a bfloat16 output and no scales. JSON goes to bench/results/.

    python bench/probes/jax_dense.py                        # GPU: 8192^3, float8 presets
    python bench/probes/jax_dense.py --presets all --shapes large,decode
    python bench/probes/jax_dense.py --small                # CPU smoke run: tiny shapes
"""

import argparse
import datetime
import functools
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_jax
import lowp_jax.nnx

SHAPES = {"large": (8192, 8192, 8192), "decode": (16, 8192, 8192)}
SMALL_SHAPES = {"large": (256, 256, 256), "decode": (16, 256, 256)}
FP8_PRESETS = ("float8_tensorwise", "float8_rowwise")
RESULTS = pathlib.Path(__file__).parents[1] / "results"
FP8_GEMM = "__cublas$lt$matmul$f8"


def time_ms(fn, args, iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean time of `iters` calls, in milliseconds."""
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(samples)


def calls_fp8_gemm(fn, args) -> bool:
    return FP8_GEMM in fn.lower(*args).compile().as_text()


def _layer_fn(graphdef):
    """A jitted forward of the layer whose structure is `graphdef`, taking its state."""

    @jax.jit
    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    return forward


def run(args, out: pathlib.Path) -> dict:
    shapes = SMALL_SHAPES if args.small else SHAPES
    if args.presets == "all":
        presets = lowp.InferenceConfig.names()
    else:
        presets = [p for p in args.presets.split(",") if p]
    iters = args.iters or (3 if args.small else 20)
    precision = jax.lax.Precision.HIGHEST if args.exact_accum else None
    rows = []
    for shape_name in args.shapes.split(","):
        m, k, n = shapes[shape_name]
        x = jax.random.normal(jax.random.key(0), (m, k), jnp.bfloat16)
        base = nnx.Linear(k, n, use_bias=False, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
        graphdef, state = nnx.split(base)
        bf16 = _layer_fn(graphdef)
        bf16_ms = time_ms(bf16, (state, x), iters)
        rows.append(_row(shape_name, (m, k, n), "bf16", "dense", bf16_ms, bf16_ms, "bf16 dot"))
        print(_format(rows[-1]), flush=True)
        # The ceiling: e4m3 codes straight into one dot, bf16 out, no scales at all.
        codes_x = x.astype(jnp.float8_e4m3fn)
        codes_w = state["kernel"].get_value().T.astype(jnp.float8_e4m3fn)  # (N, K)
        raw = jax.jit(
            lambda a, b: jax.lax.dot_general(
                a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.bfloat16
            )
        )
        ms = time_ms(raw, (codes_x, codes_w), iters)
        fp8 = calls_fp8_gemm(raw, (codes_x, codes_w))
        rows.append(_row(shape_name, (m, k, n), "e4m3 codes", "raw gemm", ms, bf16_ms, "lax", fp8))
        print(_format(rows[-1]), flush=True)
        for preset in presets:
            layer = lowp_jax.nnx.Linear(
                k,
                n,
                config=preset,
                impl=args.impl,
                use_bias=False,
                param_dtype=jnp.bfloat16,
                precision=precision,
                rngs=nnx.Rngs(0),
            )
            qgraphdef, qstate = nnx.split(layer)
            qstate = lowp_jax.quantize_params(state, preset)  # the bf16 layer's kernel
            config = lowp.InferenceConfig.from_name(preset)
            qkernel = qstate["kernel"].get_value()
            dims = (((1,), (1,)), ((), ()))
            impl, reason = lowp_jax.dot_general_impl(
                x, qkernel, dims, config=config, impl=args.impl
            )
            dense = _layer_fn(qgraphdef)
            ms = time_ms(dense, (qstate, x), iters)
            fp8 = calls_fp8_gemm(dense, (qstate, x))
            rows.append(
                _row(shape_name, (m, k, n), preset, "dense", ms, bf16_ms, impl, fp8, reason)
            )
            print(_format(rows[-1]), flush=True)
            if config.activation is not None:
                qx = lowp_jax.quantize(x, config.activation)
                gemm = jax.jit(
                    functools.partial(
                        lowp_jax.dot_general,
                        dimension_numbers=dims,
                        precision=precision,
                        impl=args.impl,
                    )
                )
                ms = time_ms(gemm, (qx, qkernel), iters)
                fp8 = calls_fp8_gemm(gemm, (qx, qkernel))
                rows.append(_row(shape_name, (m, k, n), preset, "gemm", ms, bf16_ms, impl, fp8))
                print(_format(rows[-1]), flush=True)
                quantize = jax.jit(functools.partial(lowp_jax.quantize, scheme=config.activation))
                ms = time_ms(quantize, (x,), iters)
                rows.append(_row(shape_name, (m, k, n), preset, "quantize", ms, bf16_ms, "-"))
                print(_format(rows[-1]), flush=True)
            out.write_text(json.dumps(_summary(args, rows), indent=1))  # a cut run keeps its rows
    return _summary(args, rows)


def _summary(args, rows) -> dict:
    device = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "flax": __import__("flax").__version__,
        "device": device.device_kind,
        "platform": device.platform,
        "fast_accum": not args.exact_accum,
        "impl_option": args.impl,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "rows": rows,
    }


def _row(shape_name, mkn, preset, part, ms, bf16_ms, impl, fp8_gemm=None, reason=None) -> dict:
    m, k, n = mkn
    row = {
        "shape": shape_name,
        "M": m,
        "K": k,
        "N": n,
        "preset": preset,
        # dense: the whole layer; gemm: pre-quantized operands; quantize: x only; raw gemm:
        # unscaled e4m3 codes into lax.dot_general, bf16 out
        "part": part,
        "ms": round(ms, 4),
        "tflops": round(2 * m * k * n / (ms * 1e-3) / 1e12, 2),
        "speedup_vs_bf16": round(bf16_ms / ms, 3),
        "impl": impl,
        "fp8_gemm_in_hlo": fp8_gemm,
    }
    if reason is not None:
        row["reason"] = reason
    return row


def _format(row) -> str:
    fp8 = {True: " fp8-GEMM", False: "", None: ""}[row["fp8_gemm_in_hlo"]]
    return (
        f"{row['shape']:>6} {row['M']}x{row['K']}x{row['N']} {row['preset']:>18} {row['part']:>8}: "
        f"{row['ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s  x{row['speedup_vs_bf16']:.3f} vs bf16"
        f"  [{row['impl']}{fp8}]"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes, for a CPU smoke run")
    parser.add_argument("--shapes", default="large", help="comma list of: large, decode")
    parser.add_argument(
        "--presets", default=",".join(FP8_PRESETS), help="comma list, or 'all' (default: float8)"
    )
    parser.add_argument("--impl", default="auto", choices=lowp_jax._dot.IMPLS)
    parser.add_argument(
        "--exact-accum", action="store_true", help="Precision.HIGHEST for the fp8 dot"
    )
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--out", default="", help="JSON path (default: bench/results/...)")
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    platform = jax.devices()[0].platform
    out = pathlib.Path(args.out) if args.out else RESULTS / f"jax_dense_{platform}_{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = run(args, out)
    print("\ndense layer, speed vs bf16 (the target: >= 1.7x for float8 at 8192^3 on the H200):")
    for row in result["rows"]:
        if row["part"] == "dense" and row["preset"] != "bf16":
            print(f"  {row['shape']:>6} {row['preset']:>18}: x{row['speedup_vs_bf16']:.3f}")
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
