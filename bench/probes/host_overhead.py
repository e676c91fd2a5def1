"""The host time lowp_torch's small-shape fallback adds to a launch-bound training step.

Below M*K*N = 2**39 the small-shape policy runs a float8 layer as `F.linear`, bf16's own
call, yet an H200 sweep (`bench/run.py --sections sweep`) timed the launch-bound
ones at 0.85-0.96x of bf16 while a second bf16 layer beside them ran at 0.93-1.03x. A step
there is host-bound (bf16 ~0.2 ms against ~0.03 ms of GEMMs), so whatever Python lowp
runs per call is on the clock. This times, side by side (`_timing.time_interleaved`,
one iteration count, the order rotating), at one small shape:

    step bf16             nn.Linear forward + backward, grads reset first (linear_step)
    step bf16 #2          a second nn.Linear: the run's noise
    step lowp             lowp_torch's training Linear, in its small-shape fallback
    step bf16, +5 us      bf16 with 5 us of busy host time before its F.linear: what
                          host time in a forward costs a step
    step bf16, +policy    F.linear after lowp's small-shape decision
                          (`_training.in_high_precision`), its result unused
    step lowp, F.linear   the same module with its forward replaced by F.linear: what
                          remains is not lowp's forward code
    fwd bf16 / fwd lowp   the forward alone, with grad (the graph is built, not run)

and prints each in microseconds. Off CUDA the fallback is reached by faking the fp8
kernel check for the run (always, there), so the Python path is the CUDA one.

--profile then looks for where a difference comes from, step bf16 against step lowp:
the torch profiler's events a step (ops and CUDA runtime calls on the host, where a
synchronisation would show as cudaStreamSynchronize or aten::item; on CUDA the kernels
too, with their device time, so that a different kernel choice would show), listing each
event whose count differs and those whose host or device time differs most, and
cProfile's top Python functions a step.

    python bench/probes/host_overhead.py                  # on the GPU
    python bench/probes/host_overhead.py --k 64           # CPU (faked kernel check)
    python bench/probes/host_overhead.py --profile        # and where the time goes
    python bench/probes/host_overhead.py --handoff        # the autograd engine's wake-up cost

--handoff asks why host time before a step can cost the step more than itself. On CUDA,
`backward()` hands the graph to autograd's device thread and waits for it: two thread
wake-ups a step, whose cost depends on the host (a virtual CPU that halts when idle is
woken by the hypervisor). It times, per call, the forward and `backward()` apart, with
a busy-waited gap of 0 to 64 us before each step, for two graphs: "engine" (a view of a
16-element tensor, one tiny kernel in the backward: the engine's round trip alone) and
"bf16" (the step above); then lowp's step and the second bf16 layer at gap 0. The gap
is outside both clocks: a backward that slows as the gap grows pays for its thread's
idle time. It also records what the host says of its idle states (`host_facts`).
"""

import argparse
import cProfile
import functools
import io
import json
import os
import pathlib
import pstats
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench import _timing, linear_step
from lowp_torch import _training


def spin(us: float) -> None:
    """Busy-wait `us` microseconds of host time."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def layers_at(m: int, k: int, recipe: str, device, built) -> tuple:
    """(x, dy, {name: layer}) at M = m, K = N = k: each (name, impl) of `built` made by
    `linear_step.make_layer` from one weight ("lowp" layers with `recipe`), after
    checking that "lowp" runs x in its small-shape fallback."""
    x, weight, dy = linear_step.inputs(m, k, k, device)
    x = x.requires_grad_(True)
    layers = {
        name: linear_step.make_layer(impl, recipe if impl == "lowp" else None, weight)
        for name, impl in built
    }
    check_fallback(layers["lowp"], x, recipe)
    return x, dy, layers


def variants(m: int, k: int, recipe: str, device) -> dict:
    """{name: call} of the module docstring's variants at M = m, K = N = k."""
    x, dy, layers = layers_at(
        m,
        k,
        recipe,
        device,
        (
            ("bf16", "bf16"),
            ("bf16 #2", "bf16_control"),
            ("bf16, +5 us", "bf16"),
            ("bf16, +policy", "lowp"),
            ("lowp", "lowp"),
            ("lowp, F.linear", "lowp"),
        ),
    )
    forwards = {  # the variants whose forward is replaced
        "bf16, +5 us": lambda layer, x: (spin(5.0), F.linear(x, layer.weight, layer.bias))[1],
        "bf16, +policy": lambda layer, x: (
            _training.in_high_precision(x, layer.weight, layer.recipe, layer.lowering),
            F.linear(x, layer.weight, layer.bias),
        )[1],
        "lowp, F.linear": lambda layer, x: F.linear(x, layer.weight, layer.bias),
    }
    for name, forward in forwards.items():
        layers[name].forward = functools.partial(forward, layers[name])
    calls = {f"step {name}": linear_step.fwd_bwd(layer, x, dy) for name, layer in layers.items()}
    calls["fwd bf16"] = lambda: layers["bf16"](x)
    calls["fwd lowp"] = lambda: layers["lowp"](x)
    return calls


def check_fallback(layer, x, recipe: str) -> None:
    """Raise unless lowp's `layer` runs `x` in its small-shape fallback."""
    if not _training.in_high_precision(x, layer.weight, layer.recipe, layer.lowering):
        m, k = x.shape
        raise ValueError(
            f"{m}x{k}x{layer.out_features} with {recipe} is not in the small-shape fallback "
            "here (the fp8 GEMMs would run): pick a smaller M or K"
        )


def measure(m: int, k: int, recipe: str, device, timing: _timing.Timing) -> dict:
    calls = variants(m, k, recipe, device)
    measured = _timing.time_interleaved(
        list(calls.values()), _timing.torch_sync(device), timing, same_iters=True
    )
    return {name: round(r.ms * 1e3, 2) for name, r in zip(calls, measured, strict=True)}


def profile_events(call, sync, steps: int, device) -> dict:
    """{event: (calls a step, host microseconds a step, device microseconds a step)} of
    the torch profiler over `steps` calls of `call`: ops and CUDA runtime calls on the
    host side, and on CUDA the kernels with their time on the device too."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    for _ in range(10):
        call()
    sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            call()
        sync()
    return {
        e.key: (
            e.count / steps,
            e.self_cpu_time_total / steps,
            getattr(e, "self_device_time_total", 0.0) / steps,
        )
        for e in prof.key_averages()
    }


def event_differences(base: dict, other: dict, top: int = 25) -> list[str]:
    """Lines for the events whose count a step differs, then the largest host-time and
    device-time differences, between two `profile_events` results."""
    names = sorted(set(base) | set(other))
    zero = (0.0, 0.0, 0.0)
    rows = [(n, base.get(n, zero), other.get(n, zero)) for n in names]
    header = f"{'event':<48} {'n bf16':>7} {'n lowp':>7} {'us bf16':>8} {'us lowp':>8}"
    lines = [header + f" {'dev bf16':>8} {'dev lowp':>8}"]
    counted = [r for r in rows if abs(r[1][0] - r[2][0]) > 1e-9]

    def change(r):
        return abs(r[2][1] - r[1][1]) + abs(r[2][2] - r[1][2])

    timed = sorted((r for r in rows if r not in counted), key=change, reverse=True)[:top]
    for n, (cb, tb, db), (cl, tl, dl) in counted + timed:
        lines.append(f"{n[:48]:<48} {cb:7.2f} {cl:7.2f} {tb:8.2f} {tl:8.2f} {db:8.2f} {dl:8.2f}")
    totals = [sum(v[i] for v in side.values()) for side in (base, other) for i in (1, 2)]
    lines.append(
        f"{'(all events)':<48} {'':>7} {'':>7} {totals[0]:8.2f} {totals[2]:8.2f}"
        f" {totals[1]:8.2f} {totals[3]:8.2f}"
    )
    return lines


def python_profile(call, steps: int, top: int = 12) -> str:
    """cProfile's top functions by own time over `steps` calls."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        call()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def where_the_time_goes(m: int, k: int, recipe: str, device, steps: int = 300) -> str:
    """The --profile report: step bf16 against step lowp, events and Python."""
    calls = variants(m, k, recipe, device)
    sync = _timing.torch_sync(device)
    base = profile_events(calls["step bf16"], sync, steps, device)
    other = profile_events(calls["step lowp"], sync, steps, device)
    parts = [f"# torch profiler, per step ({steps} steps each): host us, and device us on CUDA"]
    parts += event_differences(base, other)
    for name in ("step bf16", "step lowp"):
        parts.append(f"# cProfile, {name}, {steps} steps")
        parts.append(python_profile(calls[name], steps))
    return "\n".join(parts)


GAPS_US = (0, 1, 2, 4, 8, 16, 32, 64)


def timed_step(forward, leaves, cotangent, gap_us: float):
    """A training step that returns (forward seconds, backward() seconds): the leaves'
    grads reset, `gap_us` of busy host time (on neither clock), then
    `forward().backward(cotangent)`."""

    def call():
        for leaf in leaves:
            leaf.grad = None
        spin(gap_us)
        start = time.perf_counter()
        y = forward()
        mid = time.perf_counter()
        y.backward(cotangent)
        return mid - start, time.perf_counter() - mid

    return call


def handoff_cases(m: int, k: int, recipe: str, device, gaps=GAPS_US) -> dict:
    """{name: `timed_step` call} of the --handoff experiment (module docstring)."""
    p = torch.zeros(16, device=device, requires_grad=True)
    g = torch.ones(16, device=device)
    built = (("bf16", "bf16"), ("bf16 #2", "bf16_control"), ("lowp", "lowp"))
    x, dy, layers = layers_at(m, k, recipe, device, built)

    def linear(name, gap):
        layer = layers[name]
        return timed_step(lambda: layer(x), [x, *layer.parameters()], dy, gap)

    cases = {f"engine, gap {d} us": timed_step(lambda: p.view(16), [p], g, d) for d in gaps}
    cases.update({f"bf16, gap {d} us": linear("bf16", d) for d in gaps})
    cases["lowp, gap 0 us"] = linear("lowp", 0)
    cases["bf16 #2, gap 0 us"] = linear("bf16 #2", 0)
    return cases


def run_handoff(cases: dict, sync, rounds: int, calls: int, warmup: int = 50) -> dict:
    """{name: microseconds a call} of each `timed_step` case, interleaved like
    `_timing.time_interleaved` (an order shuffled each round, seeded; the device
    synchronised after each case's `calls`): the median and mean of every call's
    forward and backward() times."""
    for call in cases.values():
        for _ in range(warmup):
            call()
    sync()
    samples = {name: ([], []) for name in cases}
    order = list(cases)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            forwards, backwards = samples[name]
            for _ in range(calls):
                forward_s, backward_s = cases[name]()
                forwards.append(forward_s)
                backwards.append(backward_s)
            sync()
    return {
        name: {
            "fwd_median": round(statistics.median(f) * 1e6, 2),
            "bwd_median": round(statistics.median(b) * 1e6, 2),
            "bwd_mean": round(statistics.fmean(b) * 1e6, 2),
            "step_mean": round((statistics.fmean(f) + statistics.fmean(b)) * 1e6, 2),
        }
        for name, (f, b) in samples.items()
    }


def host_facts() -> dict:
    """What the host says of how its idle CPUs sleep (None where it says nothing)."""

    def read(path):
        try:
            return pathlib.Path(path).read_text().strip()
        except OSError:
            return None

    cpuinfo = read("/proc/cpuinfo") or ""
    return {
        "cpus": os.cpu_count(),
        "hypervisor": " hypervisor" in cpuinfo,
        "cpuidle_driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
        "cpuidle_governor": read("/sys/devices/system/cpu/cpuidle/current_governor_ro"),
        "guest_halt_poll_ns": read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
    }


def format_handoff(us: dict) -> str:
    lines = [f"{'case':<22} {'fwd med':>8} {'bwd med':>8} {'bwd mean':>9} {'step mean':>10}"]
    for name, r in us.items():
        lines.append(
            f"{name:<22} {r['fwd_median']:8.2f} {r['bwd_median']:8.2f} "
            f"{r['bwd_mean']:9.2f} {r['step_mean']:10.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=16)
    parser.add_argument("--k", type=int, default=4096, help="K = N")
    parser.add_argument("--recipe", default="float8_tensorwise")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--iters", type=int, default=1500, help="calls per repeat")
    parser.add_argument("--out", help="also write the microseconds here as JSON")
    parser.add_argument("--profile", action="store_true", help="then profile bf16 vs lowp")
    parser.add_argument(
        "--handoff", action="store_true", help="then the engine's wake-up cost (docstring)"
    )
    parser.add_argument("--handoff-rounds", type=int, default=21)
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
        report = where_the_time_goes(args.m, args.k, args.recipe, device) if args.profile else None
        handoff = None
        if args.handoff:
            cases = handoff_cases(args.m, args.k, args.recipe, device)
            handoff = run_handoff(
                cases, _timing.torch_sync(device), args.handoff_rounds, args.iters
            )
    finally:
        _training.fp8_kernels_run = real
    for name, value in us.items():
        print(f"{value:9.2f} us  {name}")
    print(
        f"lowp's fallback adds {us['step lowp'] - us['step bf16']:.2f} us a step "
        f"({us['fwd lowp'] - us['fwd bf16']:.2f} us in its forward); the second bf16 layer "
        f"differs by {us['step bf16 #2'] - us['step bf16']:.2f} us"
    )
    if report:
        print(report)
    result = {"M": args.m, "K": args.k, "recipe": args.recipe, "device": str(device), "us": us}
    if report:
        result["profile"] = report
    if handoff:
        print(f"# --handoff: microseconds a call, host {host_facts()}")
        print(format_handoff(handoff))
        result["handoff"] = handoff
        result["host"] = host_facts()
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
