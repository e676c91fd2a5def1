"""Two checkouts' `lowp_torch.quantize` on the CPU, side by side in one process.

On a shared machine a row of `bench/cpu_resources.py` moves by ±20 % between runs, more
than a change of a few passes a slab; loading both checkouts into one process and
interleaving their calls with torch's plain cast (one thread, CPU time) puts the same load
on every side. Each row asserts that both give the same codes and scales, then prints the
median (and least) CPU time over the median e4m3 cast for each, and their ratio:

    python bench/probes/cpu_quantize_ab.py --a /work/main --b . --shape 8192x8192 \
        --schemes tensor:stochastic,mx:stochastic,nvfp4:stochastic,nvfp4:nearest

A scheme is `spec:rounding` (`lowp.extend.from_spec`'s spec; "nearest" or "stochastic",
seed 0). The input is seeded normal values, built a slice at a time.
"""

import argparse
import functools
import gc
import importlib
import pathlib
import statistics
import sys
import time

import torch


def load(root: str):
    """`lowp_torch.quantize` and `lowp.extend.from_spec` of the checkout at `root` (the
    modules of an earlier load stay alive through its functions' globals)."""
    for name in [n for n in sys.modules if n == "lowp" or n.startswith(("lowp.", "lowp_torch"))]:
        del sys.modules[name]
    sys.path.insert(0, str(pathlib.Path(root).resolve()))
    try:
        quantize = importlib.import_module("lowp_torch").quantize
        from_spec = importlib.import_module("lowp.extend").from_spec
    finally:
        sys.path.pop(0)
    return quantize, from_spec


def _bytes(q) -> tuple:
    def raw(t):
        return t.contiguous().reshape(-1).view(torch.uint8) if t.dim() else t.reshape(1)

    return raw(q.codes), raw(q.scale)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a", required=True, help="the checkout to compare against")
    parser.add_argument("--b", required=True, help="the checkout under test")
    parser.add_argument("--schemes", default="tensor:stochastic,mx:stochastic,nvfp4:stochastic")
    parser.add_argument("--shape", default="8192x8192")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    quantize_a, from_spec_a = load(args.a)
    quantize_b, from_spec_b = load(args.b)
    shape = tuple(int(n) for n in args.shape.split("x"))
    x = torch.empty(shape, dtype=getattr(torch, args.dtype))
    generator = torch.Generator().manual_seed(0)
    for i in range(0, shape[0], 256):
        x[i : i + 256] = torch.randn((min(256, shape[0] - i), *shape[1:]), generator=generator)
    for item in args.schemes.split(","):
        spec, rounding = item.rsplit(":", 1)
        seed = 0 if rounding == "stochastic" else None
        kwargs = {"rounding": rounding, "seed": seed}
        calls = {
            "a": functools.partial(quantize_a, x, from_spec_a(spec), **kwargs),
            "b": functools.partial(quantize_b, x, from_spec_b(spec), **kwargs),
            "cast": functools.partial(x.to, torch.float8_e4m3fn),
        }
        got_a, got_b = _bytes(calls["a"]()), _bytes(calls["b"]())
        if not all(torch.equal(u, v) for u, v in zip(got_a, got_b, strict=True)):
            raise AssertionError(f"{item}: the checkouts' bytes differ")
        times: dict = {key: [] for key in calls}
        for _ in range(args.repeats):
            for key in ("a", "cast", "b", "cast"):
                gc.collect()
                start = time.process_time()
                calls[key]()
                times[key].append(time.process_time() - start)
        med = {key: statistics.median(v) for key, v in times.items()}
        least = {key: min(v) for key, v in times.items()}
        print(
            f"{item} {args.dtype} {args.shape}: a {med['a'] / med['cast']:.2f}x "
            f"b {med['b'] / med['cast']:.2f}x the cast (least: {least['a'] / least['cast']:.2f}x "
            f"{least['b'] / least['cast']:.2f}x), b/a {med['b'] / med['a']:.3f}, "
            f"cast {med['cast'] * 1e3:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
