"""Where the GPU time of one eager `lowp_torch.Linear` training step goes: the CUDA
kernels of five forward + backward steps, by total time (torch.profiler).

    python bench/profile_linear.py 16384x8192x8192 float8_tensorwise,float8_rowwise

This is how the transposed-codes copy showed up (PyTorch's strided copy of the wgrad's
fp8 operands, ~1 ms each at 16384 x 8192 on the H200; now `_triton_transpose`).
"""

import argparse
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp_torch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("shape", help="MxKxN")
    parser.add_argument("recipes", help="comma list of recipe names")
    parser.add_argument("--rows", type=int, default=14, help="kernels to list")
    args = parser.parse_args(argv)
    m, k, n = (int(v) for v in args.shape.split("x"))
    for recipe in args.recipes.split(","):
        layer = lowp_torch.Linear(
            k, n, bias=False, recipe=recipe, device="cuda", dtype=torch.bfloat16
        )
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3):  # warm up: Triton compiles, cuBLAS picks its kernels
            layer(x).sum().backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                layer(x).sum().backward()
            torch.cuda.synchronize()
        print(f"== {recipe} {args.shape}: 5 steps")
        print(
            prof.key_averages().table(
                sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70
            )
        )


if __name__ == "__main__":
    main()
