"""Which GEMM XLA compiles lowp_jax's tensorwise bfloat16-output fp8 dot to, by shape.

`lowp_jax._dot._fp8_dot` writes bfloat16 with the scale folded into cuBLASLt's fp8 GEMM
for two tensorwise operands and a bfloat16 output ("bf16_scalar"), from
`_dot.BF16_OUTPUT_MIN_MACS` multiply-adds up. Below that, XLA's autotuner may give the
same dot to a Triton GEMM fusion. This compiles the form (the threshold set to 0) at
shapes of 2**35 to 2**40 multiply-adds, at Precision.DEFAULT (fast accumulation, the
forward GEMM) and HIGHEST (dgrad, wgrad), and prints what each compiled module runs:
the output types of its cuBLASLt fp8 GEMMs (none: the dot went elsewhere) and its
Triton custom calls (the two Pallas casts are among them). Compiles only, ~1 min.

    python bench/probes/jax_gemm_form.py        # on a GPU
"""

import pathlib
import re
import sys
import time

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_jax
from lowp_jax import _dot

SHAPES = (
    (2048, 4096, 4096),
    (4096, 4096, 4096),
    (8192, 4096, 4096),
    (8192, 8192, 4096),
    (8192, 8192, 8192),
    (16384, 8192, 8192),
)


def compiled_gemms(text: str) -> str:
    """The output types of a compiled module's cuBLASLt fp8 GEMMs, and its Triton calls."""
    fp8 = re.findall(r"= \(?(\w+)\[[^\n]*__cublas\$lt\$matmul\$f8", text)
    triton = len(re.findall(r'custom_call_target="__gpu\$xla\.gpu\.triton"', text))
    return f"cublasLt-fp8->{fp8} triton_calls={triton}"


def probe(m: int, k: int, n: int, precision) -> str:
    scheme = lowp.TensorScaling("float8_e4m3fn")

    def product(x, w):
        a, b = lowp_jax.quantize(x, scheme), lowp_jax.quantize(w, scheme)
        return _dot._fp8_dot(a, b, precision, jnp.bfloat16).astype(jnp.bfloat16)

    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((n, k), jnp.bfloat16)
    return compiled_gemms(jax.jit(product).lower(x, w).compile().as_text())


def main(argv=None) -> list[str]:
    shapes = SHAPES if not argv else [tuple(map(int, s.split("x"))) for s in argv]
    lines = []
    with lowp_jax.gemm_output("auto", bf16_min_macs=0):  # the form at every shape
        for m, k, n in shapes:
            for precision in (lax.Precision.DEFAULT, lax.Precision.HIGHEST):
                start = time.time()
                found = probe(m, k, n, precision)
                lines.append(
                    f"{m}x{k}x{n} 2^{(m * k * n).bit_length() - 1} {precision.name}: {found} "
                    f"({time.time() - start:.1f} s)"
                )
                print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
