"""How accurate an fp8 GEMM is with and without fast accumulation, by K and by the sign
of its products; and, with --time, what turning fast accumulation off costs.

Spec §7 holds every GEMM path to 40 dB SQNR against the float64 product of the
dequantized operands. Fast accumulation (spec §8's forward GEMMs) is Hopper's reduced-
precision fp8 accumulator: `use_fast_accum=True` in `torch._scaled_mm`, and
`Precision.DEFAULT` on an fp8 dot in XLA (docs/numerics.md §8). Its error depends on
the data: products of mixed sign (a zero-mean operand, as a weight usually is) cancel,
products of one sign (two non-negative operands, or two with a common mean) pile up
with K. This measures both, on one set of tensorwise e4m3 operands per case, through:

- lowp_jax's fp8 dot (`_dot._fp8_dot`) at DEFAULT ("fast") and HIGHEST ("split"):
  writing float32 (the accumulator's error alone), bfloat16 in the float32 form, and,
  for fast, bfloat16 in the form that rounds the scale to bfloat16 ("bf16_scalar");
- `torch._scaled_mm` with use_fast_accum on and off, float32 and bfloat16 out (CUDA
  GPUs with fp8 GEMMs only);
- "bf16_rounding": the exact product rounded to bfloat16, the floor of a bf16 output.

--time times the GEMMs at the LLM shapes of docs/performance.md (`time_row` says what each pair is).

Off the GPU XLA has no fast accumulation: "fast" and "split" are the same dot there. On
a GPU each row also lists the jax paths that XLA ran elsewhere than cuBLASLt's fp8 GEMM
(`jax_off_cublaslt`, see `jax_product`; recorded since after 2026-11-30_7f48d84_gemm_accuracy.json,
whose jax_fast_f32 equals torch_fast_f32 to the hundredth of a dB up to K = 1024).

    python bench/probes/gemm_accuracy.py --out bench/results/2026-11-30_7f48d84_gemm_accuracy.json  # GPU
    python bench/probes/gemm_accuracy.py --shapes 64x256x128                            # CPU smoke
    python bench/probes/gemm_accuracy.py --time     # also times the GEMMs fast and split
"""

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_jax
from bench import _timing, jax_training
from lowp_apps.conformance import gemm as _gemm_conformance
from lowp_jax import _dot

SHAPES = ((512, 256, 2048), (512, 1024, 2048), (512, 4096, 2048), (512, 16384, 2048))
TIMED_SHAPES = ((16384, 4096, 14336), (16384, 8192, 8192))  # the LLM shapes of docs/performance.md
SCHEME = lowp.TensorScaling("float8_e4m3fn")

# {name: (x, w) from standard normals}: how the signs of the products x_ik * w_jk fall
DATA = {
    "zero_mean": lambda x, w: (x, w),
    "one_operand_nonneg": lambda x, w: (np.abs(x), w),  # post-ReLU/GELU x, zero-mean w
    "common_mean": lambda x, w: (x + 0.5, w + 0.5),  # both at mean 0.5 sigma
    "both_nonneg": lambda x, w: (np.abs(x), np.abs(w)),
}


def sqnr_db(y, exact: np.ndarray) -> float:
    """Spec §7's SQNR of y against the exact product, to a hundredth of a dB."""
    return round(_gemm_conformance.sqnr_db(y, exact), 2)


def operands(m: int, k: int, n: int, data: str):
    """Quantized (a, b) for `a @ b.T` and their exact float64 product."""
    rng = np.random.default_rng(k)
    x, w = DATA[data](rng.standard_normal((m, k)), rng.standard_normal((n, k)))
    a = lowp_jax.quantize(jnp.asarray(x, jnp.bfloat16), SCHEME)
    b = lowp_jax.quantize(jnp.asarray(w / 32, jnp.bfloat16), SCHEME)
    a64 = np.asarray(lowp_jax.dequantize(a, "float32"), np.float64)
    b64 = np.asarray(lowp_jax.dequantize(b, "float32"), np.float64)
    return a, b, a64 @ b64.T


def jax_product(a, b, precision, form: str, out_dtype) -> tuple[np.ndarray, bool]:
    """lowp_jax's fp8 dot in `form` ("bf16_scalar" or "float32"), at any size: (its
    output, whether the compiled module runs it as cuBLASLt's fp8 GEMM). At these
    sizes XLA may give the bf16_scalar form to a Triton GEMM fusion instead
    (`_dot.BF16_OUTPUT_MIN_MACS`), which has no fast accumulation to measure."""
    with lowp_jax.gemm_output("auto" if form == "bf16_scalar" else "float32", bf16_min_macs=0):
        written = _dot._gemm_output_form(
            a.scheme, b.scheme, out_dtype, a.shape[0] * a.shape[1] * b.shape[0], precision
        )
        if written != form:
            raise ValueError(f"jax_product: asked for the {form!r} form, the dot runs {written!r}")
        fn = jax.jit(lambda a, b: _dot._fp8_dot(a, b, precision, out_dtype).astype(out_dtype))
        compiled = fn.lower(a, b).compile()
        on_cublaslt = jax_training.FP8_GEMM in compiled.as_text()
        return np.asarray(compiled(a, b).astype(jnp.float32)), on_cublaslt


def torch_fp8_gemm():
    """torch, when it has a CUDA GPU with fp8 GEMMs (sm_89+), else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        return None
    return torch


def torch_operands(torch, q):
    codes = np.asarray(q.codes).view(np.uint8)
    codes = torch.from_numpy(codes.copy()).cuda().view(torch.float8_e4m3fn)
    return codes, torch.tensor(float(np.asarray(q.scale)), device="cuda")


def accuracy_row(m: int, k: int, n: int, data: str, torch) -> dict:
    a, b, exact = operands(m, k, n, data)
    fast, split = lax.Precision.DEFAULT, lax.Precision.HIGHEST
    f32, bf16 = jnp.float32, jnp.bfloat16
    row = {"M": m, "K": k, "N": n, "data": data}
    row["bf16_rounding"] = sqnr_db(
        np.asarray(jnp.asarray(exact, f32).astype(bf16), np.float64), exact
    )
    off_cublaslt = []  # jax paths the GPU ran elsewhere (`jax_product`)
    for path, precision, form, out in (
        ("jax_fast_f32", fast, "float32", f32),
        ("jax_fast_bf16", fast, "float32", bf16),
        ("jax_split_f32", split, "float32", f32),
        ("jax_split_bf16", split, "float32", bf16),
        ("jax_fast_bf16_scalar", fast, "bf16_scalar", bf16),
    ):
        y, on_cublaslt = jax_product(a, b, precision, form, out)
        row[path] = sqnr_db(y, exact)
        if not on_cublaslt:
            off_cublaslt.append(path)
    if jax.default_backend() == "gpu":
        row["jax_off_cublaslt"] = off_cublaslt
    if torch is not None:
        (ca, sa), (cb, sb) = torch_operands(torch, a), torch_operands(torch, b)
        for name, on in (("fast", True), ("split", False)):
            for out, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
                y = torch._scaled_mm(ca, cb.t(), sa, sb, out_dtype=dtype, use_fast_accum=on)
                row[f"torch_{name}_{out}"] = sqnr_db(y.float().cpu().numpy(), exact)
    return row


def time_row(m: int, k: int, n: int, torch, timing: _timing.Timing) -> dict:
    """Milliseconds of one tensorwise fp8 GEMM with a bfloat16 output, fast and split.

    torch: `torch._scaled_mm` with use_fast_accum on and off, nothing else differing.
    jax: lowp_jax's fp8 dot as the training step runs it at DEFAULT and HIGHEST, its
    output form included (`_dot._gemm_output_form`): from BF16_OUTPUT_MIN_MACS on, the
    fast one writes bfloat16 with the scale in cuBLASLt's epilogue, and the split one
    (scales no power of two) writes float32 and scales it in a pass after. So jax's
    pair is the forward GEMM's cost against a dgrad's, not accumulation's alone."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((n, k)) / 32, jnp.bfloat16)
    a, b = lowp_jax.quantize(x, SCHEME), lowp_jax.quantize(w, SCHEME)
    row = {"M": m, "K": k, "N": n}
    last = []

    def jax_call(precision):
        fn = jax.jit(lambda a, b: _dot._fp8_dot(a, b, precision, jnp.bfloat16).astype(jnp.bfloat16))

        def call():
            last[:] = [fn(a, b)]

        return call

    def jax_sync():
        jax.block_until_ready(last)

    calls = [jax_call(lax.Precision.DEFAULT), jax_call(lax.Precision.HIGHEST)]
    fast, split = _timing.time_interleaved(calls, jax_sync, timing)
    row["jax_fast_ms"], row["jax_split_ms"] = round(fast.ms, 4), round(split.ms, 4)
    if torch is not None:
        (ca, sa), (cb, sb) = torch_operands(torch, a), torch_operands(torch, b)
        calls = [
            lambda on=on: torch._scaled_mm(
                ca, cb.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=on
            )
            for on in (True, False)
        ]
        sync = _timing.torch_sync(torch.device("cuda"))
        fast, split = _timing.time_interleaved(calls, sync, timing)
        row["torch_fast_ms"], row["torch_split_ms"] = round(fast.ms, 4), round(split.ms, 4)
    return row


def format_rows(rows) -> str:
    paths = [key for key in rows[0] if key not in ("M", "K", "N", "data", "jax_off_cublaslt")]
    lines = [" ".join([f"{'MxKxN':>16} {'data':>18}"] + [f"{p:>20}" for p in paths])]
    for row in rows:
        shape = f"{row['M']}x{row['K']}x{row['N']}"
        cells = [f"{row.get(p, float('nan')):>20}" for p in paths]
        if row.get("jax_off_cublaslt"):
            cells.append(f"  (off cuBLASLt: {', '.join(row['jax_off_cublaslt'])})")
        lines.append(" ".join([f"{shape:>16} {row.get('data', ''):>18}"] + cells))
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    parser.add_argument("--data", default=",".join(DATA), help=f"comma list of {list(DATA)}")
    parser.add_argument(
        "--time", action="store_true", help="also time the GEMMs fast and split (`time_row`)"
    )
    parser.add_argument(
        "--time-shapes", default=",".join("x".join(map(str, s)) for s in TIMED_SHAPES)
    )
    parser.add_argument("--out", help="JSON rows here")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.data.split(",")) - set(DATA))
    if unknown:
        parser.error(f"--data: unknown {unknown}, known {list(DATA)}")
    torch = torch_fp8_gemm()

    def shapes(text):
        return [tuple(int(d) for d in s.split("x")) for s in text.split(",")]

    result = {
        "device": str(jax.devices()[0].device_kind),
        "torch_paths": torch is not None,
        "sqnr_db": [],
        "ms": [],
    }
    for m, k, n in shapes(args.shapes):
        for data in args.data.split(","):
            rows = result["sqnr_db"]
            rows.append(accuracy_row(m, k, n, data, torch))
            lines = format_rows(rows[-1:]).splitlines()
            print("\n".join(lines if len(rows) == 1 else lines[1:]), flush=True)
    if args.time:
        for m, k, n in shapes(args.time_shapes):
            result["ms"].append(time_row(m, k, n, torch, _timing.Timing()))
        print(format_rows(result["ms"]))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
