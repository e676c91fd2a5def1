"""The host time lowp_torch's small-shape fallback adds to a launch-bound training step.

Below M*K*N = 2**39 the small-shape policy runs a float8 layer as `F.linear`, bf16's own
call, yet the H200 sweep (bench/results/h200_sweep_j.json) timed the launch-bound
ones at 0.85-0.96x of bf16 while a second bf16 layer beside them ran at 0.93-1.03x. A step
there is host-bound (bf16 ~0.2 ms against ~0.03 ms of GEMMs), so whatever Python lowp
runs per call is on the clock. This times, side by side (`_timing.time_interleaved`,
one iteration count, the order rotating), at one small shape:

    step bf16             nn.Linear forward + backward, grads reset first (linear_step)
    step bf16 #2          a second nn.Linear: the run's noise
    step lowp             lowp_torch's training Linear, in its small-shape fallback
    step lowp, F.linear   the same module with its forward replaced by F.linear: what
                          remains is not lowp's forward code
    fwd bf16 / fwd lowp   the forward alone, with grad (the graph is built, not run)

and prints each in microseconds. Off CUDA the fallback is reached by faking the fp8
kernel check for the run (always, there), so the Python path is the CUDA one.

    python bench/host_overhead.py                  # on the GPU
    python bench/host_overhead.py --k 64           # CPU (faked kernel check)
"""

import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import _timing, linear_step
from lowp_torch import _training


def variants(m: int, k: int, recipe: str, device) -> dict:
    """{name: call} of the module docstring's variants at M = m, K = N = k."""
    x, weight, dy = linear_step.inputs(m, k, k, device)
    x = x.requires_grad_(True)
    layers = {
        name: linear_step.make_layer(impl, r, weight)
        for name, impl, r in (
            ("bf16", "bf16", None),
            ("bf16 #2", "bf16_control", None),
            ("lowp", "lowp", recipe),
            ("lowp, F.linear", "lowp", recipe),
        )
    }
    lowp_layer = layers["lowp"]
    if not _training.in_high_precision(
        x, lowp_layer.weight, lowp_layer.recipe, lowp_layer.lowering
    ):
        raise ValueError(
            f"{m}x{k}x{k} with {recipe} is not in the small-shape fallback here "
            "(the fp8 GEMMs would run): pick a smaller M or K"
        )
    plain = layers["lowp, F.linear"]
    plain.forward = lambda x: F.linear(x, plain.weight, plain.bias)
    calls = {f"step {name}": linear_step.fwd_bwd(layer, x, dy) for name, layer in layers.items()}
    calls["fwd bf16"] = lambda: layers["bf16"](x)
    calls["fwd lowp"] = lambda: layers["lowp"](x)
    return calls


def measure(m: int, k: int, recipe: str, device, timing: _timing.Timing) -> dict:
    calls = variants(m, k, recipe, device)
    measured = _timing.time_interleaved(
        list(calls.values()), _timing.torch_sync(device), timing, same_iters=True
    )
    return {name: round(r.ms * 1e3, 2) for name, r in zip(calls, measured, strict=True)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--k", type=int, default=4096, help="K = N")
    parser.add_argument("--recipe", default="float8_tensorwise")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iters", type=int, default=1500, help="calls per repeat")
    parser.add_argument("--out", help="also write the microseconds here as JSON")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    timing = _timing.Timing(
        warmup=100, repeats=args.repeats, iters=args.iters, max_iters=args.iters
    )
    real = _training.fp8_kernels_run
    if device.type != "cuda":  # the CUDA fallback's Python path, on this machine
        _training.fp8_kernels_run = lambda *a: True
    try:
        us = measure(args.m, args.k, args.recipe, device, timing)
    finally:
        _training.fp8_kernels_run = real
    for name, value in us.items():
        print(f"{value:9.2f} us  {name}")
    print(
        f"lowp's fallback adds {us['step lowp'] - us['step bf16']:.2f} us a step "
        f"({us['fwd lowp'] - us['fwd bf16']:.2f} us in its forward); the second bf16 layer "
        f"differs by {us['step bf16 #2'] - us['step bf16']:.2f} us"
    )
    result = {"M": args.m, "K": args.k, "recipe": args.recipe, "device": str(device), "us": us}
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
