"""JAX bf16 -> float8 activation casts: the Pallas kernel, XLA alone and a copy, in one run.

For TensorScaling and AxisScaling along the last axis (e4m3), at 8192 x 8192 and
16384 x 16384 bfloat16: the milliseconds of a jitted `lowp_jax.quantize` with the
Pallas element cast (`lowp_jax._pallas_cast`, what runs on an sm_90 GPU) and with XLA
alone, each as a fraction of a same-run device copy by the minimum bytes the cast moves
(as in bench/casts.py: tensorwise 2bn + n, rowwise 2bn + n + 4n/K here, since XLA
reduces the rows in a pass of its own), and whether the two paths wrote the same bytes.
Then the rowwise codes of x.T, which the training backward asks for, four ways (see
`_quantize_fn`). H200, 16384^2 bf16 (2026-11-30, bench/results/2026-11-30_b703c13_jax_cast.json):
transpose then the kernel 0.600 ms, XLA alone 0.747 ms, column scales then a 1-byte
transpose 0.747 ms, and `quantize_transposed` (column scales, then a kernel that reads
x once and writes its codes transposed, what the training backward runs) 0.424 ms,
0.965 of copy; all four the same bytes. Then an edge case check of the
kernel path against `lowp.quantize` (NumPy): subnormal, huge, signed zero, NaN and Inf
inputs in float32, bfloat16 and float16.

    python bench/probes/jax_cast.py --out bench/results/2026-11-30_b703c13_jax_cast.json     # on the GPU
"""

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_jax
from bench.probes.jax_dense import time_ms
from lowp_jax import _quantize

SCHEMES = {"tensorwise": lowp.TensorScaling(), "rowwise": lowp.AxisScaling(axis=-1)}
SHAPES = ((8192, 8192), (16384, 16384))
SMALL_SHAPES = ((256, 512),)


def _quantize_fn(scheme, pallas: bool, form: str = "plain"):
    """A fresh jit of lowp_jax.quantize with the kernel on or off (`lowp_jax.cast_kernels`
    is read when the computation is traced and is part of jit's cache key, so each gets
    its own trace). form "plain" quantizes x; "transposed" quantizes x.T (what the
    training backward asks of rowwise x and dy); "axis0" gives the same bytes from x's
    columns (AxisScaling(axis=0)), then transposes the 1-byte codes instead of the
    2-byte input; "quantize_transposed" gives them from x's columns with the transposed
    kernel writing the codes (`_quantize.quantize_transposed`)."""

    def run(x):
        if form == "quantize_transposed":
            q = _quantize.quantize_transposed(x, scheme)
            return q.codes, q.scale
        if form == "axis0":
            q = lowp_jax.quantize(x, lowp.AxisScaling(axis=0, fmt=scheme.fmt, pow2=scheme.pow2))
            return q.codes.T, q.scale.reshape(-1, 1)
        q = lowp_jax.quantize(x.T if form == "transposed" else x, scheme)
        return q.codes, q.scale

    def traced(x):
        with lowp_jax.cast_kernels("auto" if pallas else "xla"):
            return jax.jit(run).lower(x).compile()

    return traced


def _bytes(q) -> tuple[np.ndarray, np.ndarray]:
    codes, scale = q
    return np.asarray(codes).reshape(-1).view(np.uint8), np.asarray(scale).reshape(-1).view(
        np.uint8
    )


def _min_bytes(name: str, shape) -> float:
    n = shape[0] * shape[1]
    extra = 4 * n / shape[1] if name == "rowwise" else 0
    return 2 * 2 * n + n + extra


def speed(iters: int, shapes) -> list[dict]:
    rows = []
    for shape in shapes:
        x = jax.random.normal(jax.random.key(0), shape, jnp.bfloat16)
        copy = jax.jit(lambda a: a * 2)
        copy_ms = time_ms(copy, (x,), iters)
        copy_gbs = 2 * 2 * x.size / (copy_ms * 1e-3) / 1e9
        print(f"copy {shape}: {copy_ms:.4f} ms, {copy_gbs:.0f} GB/s", flush=True)
        for name, scheme in SCHEMES.items():
            outs = {}
            for path, pallas in (("pallas", True), ("xla", False)):
                fn = _quantize_fn(scheme, pallas)(x)
                uses_kernel = "lowp_float8_cast" in fn.as_text()
                ms = time_ms(fn, (x,), iters)
                outs[path] = _bytes(fn(x))
                fraction = _min_bytes(name, shape) / (ms * 1e-3) / 1e9 / copy_gbs
                rows.append(
                    {
                        "shape": list(shape),
                        "scheme": name,
                        "path": path,
                        "kernel_in_hlo": uses_kernel,
                        "ms": round(ms, 4),
                        "copy_ms": round(copy_ms, 4),
                        "fraction_of_copy": round(fraction, 3),
                    }
                )
                print(
                    f"{name:10s} {shape!s:14s} {path:6s} {ms:8.4f} ms  "
                    f"{fraction:.3f} of copy  kernel={uses_kernel}",
                    flush=True,
                )
            same = all(
                np.array_equal(a, b) for a, b in zip(outs["pallas"], outs["xla"], strict=True)
            )
            rows[-1]["same_bytes_as_pallas"] = same
            print(f"{name:10s} {shape!s:14s} same bytes: {same}", flush=True)
        rows += _transposed_rows(x, iters, copy_ms, copy_gbs)
    return rows


def _transposed_rows(x, iters, copy_ms, copy_gbs) -> list[dict]:
    """Rowwise codes of x.T four ways (module docstring of `_quantize_fn`), same bytes."""
    rows, outs = [], {}
    scheme = SCHEMES["rowwise"]
    for path, pallas, form in (
        ("pallas_xT", True, "transposed"),
        ("xla_xT", False, "transposed"),
        ("axis0_codesT", True, "axis0"),
        ("transposed_kernel", True, "quantize_transposed"),
    ):
        fn = _quantize_fn(scheme, pallas, form)(x)
        ms = time_ms(fn, (x,), iters)
        outs[path] = _bytes(fn(x))
        fraction = _min_bytes("rowwise", x.shape[::-1]) / (ms * 1e-3) / 1e9 / copy_gbs
        rows.append(
            {
                "shape": list(x.shape),
                "scheme": "rowwise_of_transpose",
                "path": path,
                "kernel_in_hlo": "lowp_float8_cast" in fn.as_text(),
                "ms": round(ms, 4),
                "copy_ms": round(copy_ms, 4),
                "fraction_of_copy": round(fraction, 3),
            }
        )
        print(f"rowwise x.T {x.shape!s:14s} {path:17s} {ms:8.4f} ms  {fraction:.3f} of copy")
    same = all(
        np.array_equal(a, b)
        for other in ("xla_xT", "axis0_codesT", "transposed_kernel")
        for a, b in zip(outs["pallas_xT"], outs[other], strict=True)
    )
    rows[-1]["same_bytes_as_pallas"] = same
    print(f"rowwise x.T {x.shape!s:14s} same bytes: {same}", flush=True)
    return rows


def _edge_input(dtype, rng) -> np.ndarray:
    """Values finite in `dtype`: its subnormals and largest normals, signed zeros, an
    all-zero and an all-tiny row, a NaN and an Inf row, a row up to e4m3's max."""
    half = np.dtype(dtype) == np.float16
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    x *= np.float32(10.0) ** rng.integers(-4 if half else -6, 5 if half else 6, size=x.shape)
    x = np.clip(x, -60000.0, 60000.0) if half else x
    tiny, huge = (6e-8, 65504.0) if half else (1e-40, 3e38)
    x[0, :8] = [tiny, -tiny, -0.0, 0.0, huge, -huge, 6.1e-5 if half else 1e-30, 5e-39]
    x[1, :] = 0.0
    x[2, :] = tiny  # an all-tiny row (float32 subnormals flush to an amax of 0)
    x[3, 5] = np.nan
    x[4, 7] = -np.inf
    x[5, :] = 448.0 * np.linspace(-1, 1, 1000, dtype=np.float32)
    return np.asarray(jnp.asarray(x).astype(dtype))


def edges() -> list[dict]:
    rng = np.random.default_rng(7)
    results = []
    for dtype in (jnp.float32, jnp.bfloat16, jnp.float16):
        x = _edge_input(dtype, rng)
        for fmt in ("float8_e4m3fn", "float8_e5m2"):
            for name, scheme in (
                ("tensorwise", lowp.TensorScaling(fmt=fmt)),
                ("tensorwise_finite", lowp.TensorScaling(fmt=fmt)),
                ("rowwise", lowp.AxisScaling(axis=-1, fmt=fmt)),
                ("rowwise_pow2", lowp.AxisScaling(axis=-1, fmt=fmt, pow2=True)),
            ):
                xi = np.where(np.isfinite(x), x, 0).astype(x.dtype) if "finite" in name else x
                got = _quantize_fn(scheme, True)(jnp.asarray(xi))
                uses_kernel = "lowp_float8_cast" in got.as_text()
                codes, scale = _bytes(got(jnp.asarray(xi)))
                want = lowp.quantize(np.asarray(jnp.asarray(xi).astype(jnp.float32)), scheme)
                ok = np.array_equal(
                    codes, want.codes.reshape(-1).view(np.uint8)
                ) and np.array_equal(
                    scale, np.asarray(want.scale, np.float32).reshape(-1).view(np.uint8)
                )
                results.append(
                    {
                        "dtype": np.dtype(dtype).name,
                        "fmt": fmt,
                        "scheme": name,
                        "kernel_in_hlo": uses_kernel,
                        "equal": ok,
                    }
                )
                print(
                    f"edge {np.dtype(dtype).name:9s} {fmt} {name:18s} equal={ok} kernel={uses_kernel}"
                )
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--small", action="store_true", help="a CPU smoke run")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    result = {"jax": jax.__version__, "device": device.device_kind, "edges": edges()}
    result["speed"] = speed(args.iters, SMALL_SHAPES if args.small else SHAPES)
    bad = [e for e in result["edges"] if not e["equal"]]
    print(f"edge cases: {len(result['edges']) - len(bad)} of {len(result['edges'])} equal")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
