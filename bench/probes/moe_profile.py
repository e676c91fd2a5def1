"""Where the GPU time of one MoE experts step goes: the kernels of five forward + backward
steps of `GroupedExperts` (bench/moe.py's layer, inputs and routing), per step, for bf16,
lowp with a recipe and torchao's fp8 rowwise prototype side by side.

    python bench/probes/moe_profile.py                        # E8xD5120xF8192xT16384, eager
    python bench/probes/moe_profile.py --shape E16xD4096xF2048xT16384 --routing skewed
    python bench/probes/moe_profile.py --mode eager,compiled --out moe_profile.txt

For each variant: the wall time of a step (CUDA events around --steps steps, after the
warm-up), then each kernel's GPU time per step and launches per step, largest first,
and their sum. Kernel names are cut to --width characters; the same kernel under two
template instantiations (e.g. two cutlass GEMM configurations) stays two rows, which
is how a GEMM that runs with another configuration (fast accumulation, a layout) shows.
`--device cpu` runs the same tables on the CPU's ops at --shape E4xD64xF128xT256 (a
smoke run of the script, no GPU numbers).
"""

import argparse
import collections
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import moe

PROFILED_STEPS = 5


def parse_shape(text: str) -> moe.MoEShape:
    """E8xD5120xF8192xT16384 -> MoEShape(8, 5120, 8192, 16384)."""
    dims = {part[0]: int(part[1:]) for part in text.split("x")}
    return moe.MoEShape(dims["E"], dims["D"], dims["F"], dims["T"])


def kernel_times(prof, device: torch.device) -> list[tuple[str, float, float]]:
    """(name, ms per step, launches per step) of each kernel (CUDA) or op (CPU), largest
    first: self device time of the kernels the profiler saw, over PROFILED_STEPS."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.key_averages():
        if device.type == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.self_device_time_total
        else:
            us = event.self_cpu_time_total
        if us <= 0:
            continue
        totals[event.key][0] += us
        totals[event.key][1] += event.count
    rows = [
        (name, us / 1e3 / PROFILED_STEPS, count / PROFILED_STEPS)
        for name, (us, count) in totals.items()
    ]
    return sorted(rows, key=lambda r: -r[1])


def step_ms(call, device: torch.device, steps: int) -> float:
    """Wall time of one step: CUDA events around `steps` steps (CPU: perf_counter)."""
    if device.type != "cuda":
        import time

        start = time.perf_counter()
        for _ in range(steps):
            call()
        return (time.perf_counter() - start) * 1e3 / steps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(steps):
        call()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / steps


def profile_variant(impl, recipe, mode, shape, routing, device, args) -> str:
    x, weights, dy, num_tokens = moe.inputs(shape, routing, device)
    module = moe.make_experts(impl, recipe, weights)
    if mode == "compiled":
        module = torch.compile(module, dynamic=False)
    call = moe.fwd_bwd(module, x, dy, num_tokens)
    for _ in range(3):  # warm up: compiles, Triton autotunes, cutlass picks its kernels
        call()
    wall = step_ms(call, device, args.steps)
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    if device.type == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            call()
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = kernel_times(prof, device)
    label = f"{impl}{' ' + recipe if recipe else ''} {mode} {shape.key} {routing}"
    lines = [f"== {label}: {wall:.3f} ms a step (wall, {args.steps} steps)"]
    lines.append(f"{'ms/step':>9} {'calls/step':>10}  kernel")
    for name, ms, calls in rows[: args.rows]:
        lines.append(f"{ms:9.3f} {calls:10.1f}  {name[: args.width]}")
    rest = rows[args.rows :]
    if rest:
        lines.append(f"{sum(r[1] for r in rest):9.3f} {'':>10}  ({len(rest)} more)")
    lines.append(f"{sum(r[1] for r in rows):9.3f} {'':>10}  total kernel time a step")
    del module, call, x, weights, dy
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default=None, help="ExDxFxT, e.g. E8xD5120xF8192xT16384")
    parser.add_argument("--routing", default="balanced", choices=moe.ROUTINGS)
    parser.add_argument("--impl", default="bf16,lowp,torchao", help="comma list")
    parser.add_argument("--recipe", default="float8_rowwise", help="lowp's recipe")
    parser.add_argument("--mode", default="eager", help="comma list of eager, compiled")
    parser.add_argument("--steps", type=int, default=10, help="steps of the wall time")
    parser.add_argument("--rows", type=int, default=16, help="kernels to list")
    parser.add_argument("--width", type=int, default=90, help="characters of a name")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", help="also write the tables here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    default = moe.FULL[0] if device.type == "cuda" else moe.SMALL[0]
    shape = parse_shape(args.shape) if args.shape else default
    tables = []
    for impl in args.impl.split(","):
        if impl == "torchao" and moe.torchao_problem(device) is not None:
            tables.append(f"== torchao skipped: {moe.torchao_problem(device)}")
            print(tables[-1], flush=True)
            continue
        recipe = args.recipe if impl == "lowp" else None
        for mode in args.mode.split(","):
            tables.append(profile_variant(impl, recipe, mode, shape, args.routing, device, args))
            print(tables[-1], flush=True)
    if args.out:
        pathlib.Path(args.out).write_text("\n".join(tables) + "\n")


if __name__ == "__main__":
    main()
