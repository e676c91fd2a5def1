"""Where the GPU time of one `Linear` training step goes: the CUDA kernels of five
forward + backward steps, by total time (torch.profiler), for lowp, torchao or bf16,
eager or compiled — the same layers and calls `linear_step` times.

    python bench/probes/profile_linear.py 16384x8192x8192 float8_tensorwise,float8_rowwise
    python bench/probes/profile_linear.py 16384x8192x8192 float8_tensorwise \\
        --impl lowp,torchao --mode compiled --out profile.txt

This is how the transposed-codes copy showed up (PyTorch's strided copy of the wgrad's
fp8 operands, ~1 ms each at 16384 x 8192 on the H200; now `_triton_transpose`).
"""

import argparse
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import linear_step


def profile_step(impl: str, recipe: str, mode: str, shape, rows: int) -> str:
    """The kernel table of five steps of one variant, after three warm-up steps."""
    m, k, n = shape
    x, weight, dy = linear_step.inputs(m, k, n, "cuda")
    layer = linear_step.make_layer(impl, recipe, weight)
    module = torch.compile(layer, dynamic=False) if mode == "compiled" else layer
    step = linear_step.fwd_bwd(module, x, dy)
    for _ in range(3):  # warm up: compiles, Triton autotunes, cuBLAS picks its kernels
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90
    )
    linear_step.release(x.device)
    return f"== {impl} {recipe} {mode} {m}x{k}x{n}: 5 steps\n{table}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("shape", help="MxKxN")
    parser.add_argument("recipes", help="comma list of recipe names")
    parser.add_argument("--impl", default="lowp", help="comma list of lowp, torchao, bf16")
    parser.add_argument("--mode", default="eager", help="comma list of eager, compiled")
    parser.add_argument("--rows", type=int, default=14, help="kernels to list")
    parser.add_argument("--out", help="also write the tables here")
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split("x"))
    tables = []
    for impl in args.impl.split(","):
        for recipe in args.recipes.split(",") if impl != "bf16" else [None]:
            for mode in args.mode.split(","):
                tables.append(profile_step(impl, recipe, mode, shape, args.rows))
                print(tables[-1], flush=True)
    if args.out:
        pathlib.Path(args.out).write_text("\n".join(tables))


if __name__ == "__main__":
    main()
