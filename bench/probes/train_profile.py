"""Where the time of the model slice's compiled training step goes: host or device.

bench/model.py's slice (Llama-3-8B-shaped, two layers) for each training variant at
`--tokens` tokens, `torch.compile`d: the step's host time (to return) and wall time
(after a synchronize) over 20 calls, then `torch.profiler` tables of 5 calls by device
time and by host time (the ops whose own CPU time adds up, for a host-bound step); for
lowp variants first the small-shape policy's table
(`lowp_torch.small_shapes_report`, compiled), which says which layers run fp8.
`--cast-kernels` traces lowp's casts under that `lowp_torch.cast_kernels` mode.

    python bench/probes/train_profile.py lowp_float8_rowwise torchao_tensorwise --tokens 2048
    python bench/probes/train_profile.py lowp_float8_rowwise --cast-kernels torch
"""

import argparse
import pathlib
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp_torch
from bench import model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", help="bf16, lowp_<recipe> or torchao_<recipe>")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--rows", type=int, default=20, help="rows of the device-time table")
    parser.add_argument("--host-rows", type=int, default=15, help="rows of the host-time table")
    parser.add_argument("--cast-kernels", default="auto", choices=("auto", "triton", "torch"))
    args = parser.parse_args()
    device = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(1)
    shape = (2, args.tokens // 2, model.LLAMA3_8B.dim)
    x = torch.randn(shape, generator=gen).to(device, torch.bfloat16)
    dy = torch.randn(shape, generator=gen).to(device, torch.bfloat16)
    for variant in args.variants:
        net = model._train_variant(variant, model.LLAMA3_8B, device)
        if variant.startswith("lowp_"):
            print(lowp_torch.small_shapes_report(net, args.tokens, compiled=True))
        step = model._train_call(torch.compile(net, dynamic=False), x, dy)
        with lowp_torch.cast_kernels(args.cast_kernels):  # read when the graph is traced
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(20):
                step()
            host = (time.perf_counter() - start) / 20
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / 20
            print(
                f"{variant} compiled T={args.tokens} cast_kernels={args.cast_kernels}: "
                f"host {host * 1e3:.3f} ms, wall {wall * 1e3:.3f} ms"
            )
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
        table = prof.key_averages().table
        print(table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=70))
        print(
            table(sort_by="self_cpu_time_total", row_limit=args.host_rows, max_name_column_width=70)
        )


if __name__ == "__main__":
    main()
