"""Quantized nn.Linear forward per inference preset, next to bf16, from one run.

For each shape (M, K, N) and preset: a bias-free `nn.Linear(K, N)` in bfloat16,
`lowp_torch.quantize_`d with the preset, timed on the same input as the bf16 layer.
The forward includes quantizing the activation (dynamic scaling), as a model's would.
Prints milliseconds, TFLOP/s (2MKN / time), the speed ratio to bf16 and the GEMM kernel
that ran (read from lowp_torch's debug log on one eager call: under torch.compile the
same static choice is made and nothing is logged); writes the table as JSON to
bench/results/.

    python bench/torch_linear.py                      # H200: 8192^3 and M=16 decode, compiled
    python bench/torch_linear.py --modes eager,compile --presets float8_rowwise,mxfp8
    python bench/torch_linear.py --small              # CPU smoke run: tiny shapes
"""

import argparse
import datetime
import json
import logging
import pathlib
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp
import lowp_torch

SHAPES = {"large": (8192, 8192, 8192), "decode": (16, 8192, 8192)}
SMALL_SHAPES = {"large": (256, 256, 256), "decode": (16, 256, 256)}
RESULTS = pathlib.Path(__file__).parent / "results"


class _KernelLog(logging.Handler):
    """Collects the kernel lowp_torch's scaled_matmul chose ("kernel='scaled_mm'")."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.kernels = []

    def emit(self, record):
        found = re.search(r"kernel='(\w+)'", record.getMessage())
        if found:
            self.kernels.append(found.group(1))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, x, device, iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean time of `iters` calls, in milliseconds."""
    for _ in range(3):
        fn(x)
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            fn(x)
        _sync(device)
        samples.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(samples)


def kernel_used(layer, x) -> str:
    """One eager forward with lowp_torch's debug log captured: the kernel it names."""
    logger = logging.getLogger("lowp_torch")
    handler, level = _KernelLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        layer(x)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    weight = layer.weight
    if weight.linear.activation is None:
        return "bf16 matmul (weight-only: dequantized weight)"
    return handler.kernels[-1] if handler.kernels else "?"


def run(args, out: pathlib.Path) -> dict:
    device = torch.device(args.device)
    shapes = SMALL_SHAPES if args.small else SHAPES
    presets = args.presets.split(",") if args.presets else list(lowp.InferenceConfig.names())
    modes = args.modes.split(",")
    iters = args.iters or (3 if args.small else 20)
    rows = []
    for shape_name in args.shapes.split(","):
        m, k, n = shapes[shape_name]
        torch.manual_seed(0)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        base = torch.nn.Linear(k, n, bias=False, device=device, dtype=torch.bfloat16).eval()
        for mode in modes:
            torch._dynamo.reset()  # each layer gets its own graphs, not the shared recompile limit
            with torch.no_grad():
                fn = torch.compile(base) if mode == "compile" else base
                bf16_ms = time_ms(fn, x, device, iters)
            rows.append(_row(shape_name, (m, k, n), "bf16", mode, bf16_ms, bf16_ms, "bf16 matmul"))
            for preset in presets:
                layer = torch.nn.Linear(
                    k, n, bias=False, device=device, dtype=torch.bfloat16
                ).eval()
                layer.weight.data.copy_(base.weight.data)
                lowp_torch.quantize_(
                    layer, preset, kernel=args.kernel, fast_accum=not args.exact_accum
                )
                torch._dynamo.reset()
                with torch.no_grad():
                    kernel = kernel_used(layer, x)
                    fn = torch.compile(layer) if mode == "compile" else layer
                    ms = time_ms(fn, x, device, iters)
                rows.append(_row(shape_name, (m, k, n), preset, mode, ms, bf16_ms, kernel))
                print(_format(rows[-1]), flush=True)
                out.write_text(
                    json.dumps(_summary(args, device, rows), indent=1)
                )  # a cut run keeps its rows
                del layer, fn
    return _summary(args, device, rows)


def _summary(args, device, rows) -> dict:
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability(device))
        if device.type == "cuda"
        else None,
        "fast_accum": not args.exact_accum,
        "kernel_option": args.kernel,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "rows": rows,
    }


def _row(shape_name, mkn, preset, mode, ms, bf16_ms, kernel) -> dict:
    m, k, n = mkn
    return {
        "shape": shape_name,
        "M": m,
        "K": k,
        "N": n,
        "preset": preset,
        "mode": mode,
        "ms": round(ms, 4),
        "tflops": round(2 * m * k * n / (ms * 1e-3) / 1e12, 2),
        "speedup_vs_bf16": round(bf16_ms / ms, 3),
        "kernel": kernel,
    }


def _format(row) -> str:
    return (
        f"{row['shape']:>6} {row['M']}x{row['K']}x{row['N']} {row['mode']:>7} {row['preset']:>18}: "
        f"{row['ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s  x{row['speedup_vs_bf16']:.3f} vs bf16  [{row['kernel']}]"
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
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--out", default="", help="JSON path (default: bench/results/...)")
    args = parser.parse_args(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    device_kind = args.device.split(":")[0]
    out = (
        pathlib.Path(args.out) if args.out else RESULTS / f"torch_linear_{device_kind}_{stamp}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    result = run(args, out)
    for row in result["rows"]:
        if row["preset"] == "bf16":
            print(_format(row))
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
