"""Where the host time of the model slice's inference step goes, at few tokens.

bench/model.py's slice (Llama-3-8B-shaped, two layers) for one variant, with `--tokens`
tokens (default 1): the step's host time (to return) and wall time (after a synchronize),
eager and `torch.compile`d, 200 calls each, then a `torch.profiler` table of 20 compiled
calls by self CPU time and by device time. At one token every variant's step is
host-bound; this says what the compiled step's host time is spent on.

    python bench/probes/infer_profile.py lowp_float8_tensorwise
    python bench/probes/infer_profile.py bf16 --tokens 16
"""

import argparse
import pathlib
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variant", help="bf16, lowp_<preset> or torchao_<granularity>")
    parser.add_argument("--tokens", type=int, default=1)
    args = parser.parse_args()
    device = torch.device("cuda")
    eager = model._infer_variant(args.variant, model.LLAMA3_8B, device)
    compiled = torch.compile(eager, dynamic=False)
    x = torch.randn(1, args.tokens, model.LLAMA3_8B.dim, dtype=torch.bfloat16, device=device)
    with torch.inference_mode():
        for step, mode in ((eager, "eager"), (compiled, "compiled")):
            for _ in range(5):
                step(x)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(200):
                step(x)
            host = (time.perf_counter() - start) / 200
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / 200
            print(f"{args.variant} {mode} host {host * 1e6:.1f} us wall {wall * 1e6:.1f} us")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                compiled(x)
            torch.cuda.synchronize()
    table = prof.key_averages().table
    print(table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    print(table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
