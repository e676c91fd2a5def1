"""Quantized nn.Linear forward per inference preset, next to bf16, from one run.

For each shape (M, K, N) and preset: a bias-free `nn.Linear(K, N)` in bfloat16,
`lowp_torch.quantize_`d with the preset, timed on the same input as the bf16 layer.
The forward includes quantizing the activation (dynamic scaling), as a model's would.
Prints milliseconds, TFLOP/s (2MKN / time), the speed ratio to bf16 and the GEMM kernel
that ran (read from lowp_torch's debug log on one eager call: under torch.compile the
same static choice is made and nothing is logged); writes the table as JSON to
bench/results/. `bench/run.py` runs the same measurements as its "gemm" section
(`items`).

    python bench/torch_linear.py                      # H200: 8192^3 and M=16 decode, compiled
    python bench/torch_linear.py --modes eager,compile --presets float8_rowwise,mxfp8
    python bench/torch_linear.py --small              # CPU smoke run: tiny shapes
"""

import argparse
import datetime
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp
import lowp_torch
from bench import _timing, _torch_log

SHAPES = {"large": (8192, 8192, 8192), "decode": (16, 8192, 8192)}
SMALL_SHAPES = {"large": (256, 256, 256), "decode": (16, 256, 256)}
RESULTS = pathlib.Path(__file__).parent / "results"


def items(shapes: dict, presets, modes, device, timing, *, kernel, fast_accum, backend):
    """The measurements, in order, as (label, measure) pairs; `measure()` returns a
    one-row list. A shape's bf16 row comes first in each mode, and the presets' rows
    after it carry their speed ratio to it."""
    for shape_name, (m, k, n) in shapes.items():
        torch.manual_seed(0)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        weight = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        for mode in modes:
            bf16_ms = {}

            def bf16(mode=mode, bf16_ms=bf16_ms, shape=(shape_name, m, k, n), x=x, w=weight):
                row = _measure(_linear(w), mode, shape, "bf16", x, timing, backend, None)
                bf16_ms["ms"] = row["ms"]
                return [row]

            yield f"{shape_name} {mode} bf16", bf16
            for preset in presets:

                def quantized(
                    preset=preset,
                    mode=mode,
                    bf16_ms=bf16_ms,
                    shape=(shape_name, m, k, n),
                    x=x,
                    w=weight,
                ):
                    layer = _linear(w)
                    lowp_torch.quantize_(layer, preset, kernel=kernel, fast_accum=fast_accum)
                    return [_measure(layer, mode, shape, preset, x, timing, backend, bf16_ms)]

                yield f"{shape_name} {mode} {preset}", quantized


def _linear(weight):
    n, k = weight.shape
    layer = torch.nn.Linear(k, n, bias=False, device=weight.device, dtype=weight.dtype).eval()
    with torch.no_grad():
        layer.weight.copy_(weight)
    return layer


def _measure(layer, mode, shape, preset, x, timing, backend, bf16_ms) -> dict:
    shape_name, m, k, n = shape
    torch._dynamo.reset()  # each layer gets its own graphs, not the shared recompile limit
    with torch.no_grad():
        if preset == "bf16":
            kernel = "bf16 matmul"
        elif layer.weight.linear.activation is None:
            kernel = "bf16 matmul (weight-only: dequantized weight)"
        else:
            gemms = _torch_log.lowp_decisions(lambda: layer(x))["gemms"]
            kernel = gemms[-1] if gemms else "?"
        fn = torch.compile(layer, backend=backend) if mode == "compile" else layer
        result = _timing.time_calls(lambda: fn(x), _timing.torch_sync(x.device), timing)
    ms = result.ms
    reference = bf16_ms["ms"] if bf16_ms else ms
    return {
        "shape": shape_name,
        "M": m,
        "K": k,
        "N": n,
        "preset": preset,
        "mode": mode,
        "ms": round(ms, 4),
        "tflops": round(2 * m * k * n / (ms * 1e-3) / 1e12, 2),
        "speedup_vs_bf16": round(reference / ms, 3) if reference else None,
        "kernel": kernel,
    }


def describe(device, fast_accum: bool, kernel: str) -> dict:
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability(device))
        if device.type == "cuda"
        else None,
        "fast_accum": fast_accum,
        "kernel_option": kernel,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def format_row(row) -> str:
    ratio = "" if row["speedup_vs_bf16"] is None else f"x{row['speedup_vs_bf16']:.3f} vs bf16"
    return (
        f"{row['shape']:>6} {row['M']}x{row['K']}x{row['N']} {row['mode']:>7} {row['preset']:>18}: "
        f"{row['ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s  {ratio}  [{row['kernel']}]"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes, for a CPU smoke run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", default="large,decode", help="comma list of: large, decode")
    parser.add_argument("--presets", default="", help="comma list (default: every preset)")
    parser.add_argument("--modes", default="compile", help="comma list of: eager, compile")
    parser.add_argument(
        "--kernel", default="auto", choices=["auto", "scaled_mm", "fbgemm", "emulated"]
    )
    parser.add_argument("--exact-accum", action="store_true", help="no fp8 fast accumulation")
    parser.add_argument("--iters", type=int, default=0, help="calls per timed repeat")
    parser.add_argument("--out", default="", help="JSON path (default: bench/results/...)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = pathlib.Path(args.out or RESULTS / f"torch_linear_{device.type}_{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    shapes = SMALL_SHAPES if args.small else SHAPES
    iters = args.iters or (3 if args.small else 20)
    timing = _timing.Timing(repeats=5, iters=iters)
    result = describe(device, not args.exact_accum, args.kernel) | {"rows": []}
    plan = items(
        {name: shapes[name] for name in args.shapes.split(",")},
        args.presets.split(",") if args.presets else list(lowp.InferenceConfig.names()),
        args.modes.split(","),
        device,
        timing,
        kernel=args.kernel,
        fast_accum=not args.exact_accum,
        backend="inductor",
    )
    for _, measure in plan:
        for row in measure():
            result["rows"].append(row)
            print(format_row(row), flush=True)
            out.write_text(json.dumps(result, indent=1))  # a cut run keeps its rows
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
