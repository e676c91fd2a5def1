"""How every bench section times a call, and the time budget they share.

One timer for PyTorch and one for JAX, the same rule in both: warm up (compilation
and first-call costs stay out, but their time is returned), pick an iteration count
that makes one repeat last about `target_s`, and take the median over `repeats` of
the mean time of those iterations, with the device synchronised around each repeat.
Synchronising per repeat rather than per call keeps the host's launch overhead in
the number only where the device would otherwise be idle, as in a training loop.
"""

import dataclasses
import math
import random
import statistics
import time


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long to time each measurement.

    Attributes:
      warmup: calls before timing; the first compiles where anything does.
      repeats: timed repeats; the median is reported.
      target_s: wall time one repeat aims at; iterations per repeat follow from it.
      max_iters: a cap on iterations per repeat (tiny CPU shapes would take thousands).
      iters: iterations per repeat, fixed; 0 derives them from target_s.
    """

    warmup: int = 3
    repeats: int = 5
    target_s: float = 0.05
    max_iters: int = 200
    iters: int = 0

    def __post_init__(self):
        if (
            min(self.warmup, self.repeats, self.max_iters) < 1
            or self.target_s < 0
            or self.iters < 0
        ):
            raise ValueError(f"Timing needs warmup, repeats, max_iters >= 1, target_s >= 0: {self}")


@dataclasses.dataclass(frozen=True)
class Measured:
    """ms: median milliseconds per call; warmup_s: the warm-up calls' seconds (compile
    time, for a compiled callable); iters: calls per timed repeat."""

    ms: float
    warmup_s: float
    iters: int


def build_each(variants, build, on_error=None) -> tuple[list, list]:
    """(the variants built, what `build(variant)` returned for each), for timing side by
    side: a variant whose build raises (a layer that fails to compile or run) is left
    out and handed to on_error(variant, exception), so that the others are still timed;
    without on_error the exception propagates."""
    kept, built = [], []
    for variant in variants:
        try:
            result = build(variant)
        except Exception as e:  # reported through on_error; the other variants go on
            if on_error is None:
                raise
            on_error(variant, e)
            continue
        kept.append(variant)
        built.append(result)
    return kept, built


def time_calls(fn, sync, timing: Timing) -> Measured:
    """Time `fn()`, with `sync()` waiting for the device's queued work."""
    return time_interleaved([fn], sync, timing)[0]


def time_interleaved(fns, sync, timing: Timing, same_iters: bool = False) -> list[Measured]:
    """Time several callables side by side: each warmed up (the warm-up calls' time
    kept) and given its iteration count (`timing.iters`, or what makes a repeat last
    `target_s`), then `timing.repeats` rounds in which every one runs its repeat in turn
    (in an order shuffled each round, seeded), each reported as the median of its repeats.

    For launch-bound calls (the small-shape sweep: a step of ~0.1 ms), whose times
    drift with the host's load and the GPU's clocks over a run: the variants then see
    the same drift, instead of one variant's repeats all falling in a slow stretch.
    same_iters: every callable runs the largest of their iteration counts, so that
    calls expected to take the same time are timed alike (the count comes from timing
    one call, which for a launch-bound call varies by 2x from one call to the next).

    Shuffled, not rotated: rotating gives each callable the same predecessor in every
    round, so whatever what ran before does to a call lands on one variant every time.
    (On the H200's host, of two identical bf16 layers the first built was 5-13 us
    slower in all eight runs of bench/probes/host_overhead.py, rotated and shuffled alike:
    that offset is not the order's. 2026-11-30.)
    """
    warmups, iters = [], []
    for fn in fns:
        start = time.perf_counter()
        for _ in range(timing.warmup):
            fn()
        sync()
        warmups.append(time.perf_counter() - start)
        iters.append(timing.iters or _iters_for_target(fn, sync, timing))
    if same_iters:
        iters = [max(iters)] * len(fns)
    samples = [[] for _ in fns]
    order = list(range(len(fns)))
    shuffle = random.Random(0).shuffle
    for _ in range(timing.repeats):
        shuffle(order)
        for j in order:
            start = time.perf_counter()
            for _ in range(iters[j]):
                fns[j]()
            sync()
            samples[j].append((time.perf_counter() - start) * 1e3 / iters[j])
    return [
        Measured(statistics.median(s), w, n)
        for s, w, n in zip(samples, warmups, iters, strict=True)
    ]


def _iters_for_target(fn, sync, timing: Timing) -> int:
    start = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - start, 1e-6)
    return max(1, min(timing.max_iters, math.ceil(timing.target_s / one)))


def torch_sync(device):
    """The `sync` for `time_calls` on a torch device."""
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_jax(fn, args, timing: Timing) -> Measured:
    """Time `fn(*args)`, blocking on its outputs (JAX dispatches asynchronously)."""
    import jax

    last = []

    def call():
        last[:] = [fn(*args)]

    return time_calls(call, lambda: jax.block_until_ready(last), timing)


class Budget:
    """Wall-clock seconds left for the whole run; None means no limit.

    A section asks `fits(estimate)` before each item and skips it (recording why)
    once the time left is under the estimate, so a run cut to fit a fixed-length
    GPU call still ends cleanly and writes what it has.
    """

    def __init__(self, seconds: float | None):
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def fits(self, estimate_s: float) -> bool:
        return self.left() >= estimate_s
