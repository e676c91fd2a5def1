"""Where the first call of a JAX training step goes: tracing and lowering, the size of
what XLA gets, and XLA's compile, with and without its GEMM autotuner.

The step is bench/jax_model.py's (two Llama-3-8B decoder-layer slices, forward +
backward, input (2, T/2, 4096)) for each variant: "bf16", "flax_fp8" (flax's
`Fp8DirectDotGeneralOp`) and "lowp_<recipe>" (`training_dot_general_cls(recipe)`, with
`small_shapes` and `impl` as given). Nothing is allocated: the step is lowered from
shapes and compiled, never run. Every variant and autotune level compiles in a fresh
process, so that no compile reuses another's autotuning results.

For each, one JSON line: lower_s (trace + lower), stablehlo_lines, compile_s (XLA),
hlo_lines (the optimized HLO) and the autotune level ("default", or 0: XLA's
`xla_gpu_autotune_level`, which on the GPU skips timing GEMM algorithms and Triton
configurations; ignored on the CPU).

    python bench/probes/jax_compile.py                                     # GPU, T = 8192
    python bench/probes/jax_compile.py --autotune default,0 --variants lowp_float8_tensorwise
    python bench/probes/jax_compile.py --impl fp8 --small-shapes quantize  # CPU: the GPU's dots
"""

import argparse
import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VARIANTS = ("bf16", "flax_fp8", "lowp_float8_tensorwise", "lowp_float8_rowwise")


def measure(variant: str, tokens: int, autotune: str, impl: str, small_shapes: str) -> dict:
    import jax
    import jax.numpy as jnp

    import lowp_jax
    from bench import jax_model
    from bench.model import LLAMA3_8B

    shape = LLAMA3_8B
    if variant.startswith("lowp_"):
        recipe = variant.removeprefix("lowp_")
        dot = {
            "dot_general_cls": lowp_jax.training_dot_general_cls(
                recipe, impl=impl, small_shapes=small_shapes
            )
        }
    else:
        dot = jax_model.dense_dot(variant)
    model = jax_model.Slice(shape, dot)
    x = jax.ShapeDtypeStruct((2, tokens // 2, shape.dim), jnp.bfloat16)
    variables = jax.eval_shape(model.init, jax.random.key(0), x)

    def step(variables, x, dy):
        y, vjp = jax.vjp(model.apply, variables, x)
        return y, vjp(dy)

    start = time.perf_counter()
    lowered = jax.jit(step).lower(variables, x, x)
    lowered_at = time.perf_counter()
    options = {} if autotune == "default" else {"xla_gpu_autotune_level": int(autotune)}
    compiled = lowered.compile(compiler_options=options)
    compiled_at = time.perf_counter()
    return {
        "variant": variant,
        "tokens": tokens,
        "autotune": autotune,
        "impl": impl,
        "small_shapes": small_shapes,
        "platform": jax.devices()[0].platform,
        "device": jax.devices()[0].device_kind,
        "lower_s": round(lowered_at - start, 3),
        "stablehlo_lines": lowered.as_text().count("\n"),
        "compile_s": round(compiled_at - lowered_at, 3),
        "hlo_lines": compiled.as_text().count("\n"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--autotune", default="default", help="comma-separated: default, 0..4")
    parser.add_argument("--impl", default="auto", help="lowp_jax's training impl")
    parser.add_argument("--small-shapes", default="auto", choices=("auto", "quantize"))
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child
    args = parser.parse_args(argv)
    if args.one:
        print(
            json.dumps(
                measure(args.variants, args.tokens, args.autotune, args.impl, args.small_shapes)
            )
        )
        return
    for variant in args.variants.split(","):
        for autotune in args.autotune.split(","):
            child = [
                sys.executable, __file__, "--one", "--variants", variant,
                "--tokens", str(args.tokens), "--autotune", autotune,
                "--impl", args.impl, "--small-shapes", args.small_shapes,
            ]  # fmt: skip
            done = subprocess.run(child, capture_output=True, text=True, check=False)
            lines = done.stdout.strip().splitlines()
            if done.returncode or not lines:
                raise SystemExit(f"{variant} (autotune {autotune}) failed:\n{done.stderr[-3000:]}")
            print(lines[-1], flush=True)


if __name__ == "__main__":
    main()
