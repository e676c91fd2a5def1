"""CPU resources of quantizing on the CPU, per scheme, at 8192 x 8192 by default: the NumPy
reference `lowp.quantize` against ml_dtypes' plain cast of the same array (path "numpy"),
and `lowp_torch.quantize` on a CPU tensor against torch's plain cast (path "torch").

Each measurement runs in a fresh child process, so one row's high-water mark cannot
hide another's: the child builds its input a slice at a time (no temporary larger than
a slice), restarts the kernel's high-water mark (VmHWM) and reads its resident set,
quantizes once, reads the high-water mark; the difference is the peak the call added,
output included. Then it times more calls: the median wall time, and the
CPU time of the process (on a machine shared with other work, the steadier of the two).
The plain casts (`x.astype(ml_dtypes.float8_e4m3fn)` or `x.to(torch.float8_e4m3fn)`, and
to the scheme's own element format where the library has it) are timed in the same child,
in turn with the call; the cast's peak is measured in a child of its own. The torch
child runs on one thread (`torch.set_num_threads(1)`), the call and its cast alike;
torch's cast is still several times faster than ml_dtypes', so the torch rows' ratios
are against a harder bar.

    python bench/cpu_resources.py                              # 8192x8192, float32 and bf16
    python bench/cpu_resources.py --shape 1024x1024 --schemes tensor,mxfp8 --dtypes float32
    python bench/cpu_resources.py --paths torch                # lowp_torch.quantize only
    python bench/run.py --sections cpu_resources --out bench/results/DATE_COMMIT_cpu_resources.json

A row's `peak_beyond_output_vs_input` is (peak increase - output bytes) / input bytes:
the aim of issue 23 is <= 2; `time_vs_cast` is the quantize time over the e4m3 plain cast
of the same input (aim <= 3 for fp8), `time_vs_own_cast` over the cast to the scheme's
element format.
"""

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name -> (scheme spec for lowp.extend's from_spec, rounding)
SCHEMES = {
    "tensor": ("tensor", "nearest"),
    "tensor_e5m2": ("tensor:fmt=float8_e5m2", "nearest"),
    "rowwise": ("axis:axis=-1", "nearest"),
    "colwise": ("axis:axis=0", "nearest"),
    "block128": ("block:block=128x128", "nearest"),
    "group128": ("group:block=128", "nearest"),
    "mxfp8": ("mx", "nearest"),
    "mxfp6": ("mx:fmt=float6_e2m3fn", "nearest"),
    "mxfp4": ("mx:fmt=float4_e2m1fn", "nearest"),
    "nvfp4": ("nvfp4", "nearest"),
    "tensor_sr": ("tensor", "stochastic"),
    "mxfp8_sr": ("mx", "stochastic"),
    "nvfp4_sr": ("nvfp4", "stochastic"),
}
DTYPES = ("float32", "bfloat16")
PATHS = ("numpy", "torch")


def _rss_bytes() -> int:
    """The resident set now (Linux /proc), else the high-water mark so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return _peak_rss_bytes()


def _reset_peak() -> None:
    """Restart the high-water mark at the resident set now (Linux: VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # ru_maxrss then counts from the process start: an overestimate


def _peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _input(shape, hp_dtype: str):
    """A seeded normal array built a slice at a time (no full-size temporary)."""
    import ml_dtypes

    dtype = np.float32 if hp_dtype == "float32" else np.dtype(getattr(ml_dtypes, hp_dtype))
    x = np.empty(shape, dtype=dtype)
    rng = np.random.default_rng(0)
    step = max(1, (1 << 20) // max(1, shape[-1]))
    for start in range(0, shape[0], step):
        part = rng.standard_normal((min(step, shape[0] - start), *shape[1:]), dtype=np.float32)
        x[start : start + step] = part
    return x


def child(args) -> dict:
    """One measurement in this (fresh) process; see the module docstring."""
    import gc

    from lowp.extend import from_spec

    shape = tuple(int(n) for n in args.shape.split("x"))
    x = _input(shape, args.dtype)
    if args.path == "torch":
        import torch

        # One thread, as the reference and ml_dtypes run: on a shared machine intra-op
        # threads wait on each other at every op, and the CPU time counts their spinning.
        torch.set_num_threads(1)
        x = torch.from_numpy(x.view(np.int16) if args.dtype == "bfloat16" else x)  # no copy
        x = x.view(torch.bfloat16) if args.dtype == "bfloat16" else x
    casts = _casts(args.path, x)
    if args.what == "cast":
        call = casts[args.fmt]
    else:
        spec, rounding = SCHEMES[args.what]
        scheme = from_spec(spec)
        seed = 0 if rounding == "stochastic" else None
        if args.path == "torch":
            import lowp_torch

            def call():
                return lowp_torch.quantize(x, scheme, rounding=rounding, seed=seed)

        else:
            import lowp

            def call():
                return lowp.quantize(x, scheme, rounding=rounding, seed=seed)

    gc.collect()
    _reset_peak()
    before = _rss_bytes()
    out = call()
    peak = _peak_rss_bytes() - before
    out_bytes = _nbytes(out) if args.what == "cast" else _qtensor_bytes(out)
    del out
    # The plain casts are timed in turn with the call, so a load that comes and goes on
    # a shared machine weighs on both sides of the ratio.
    timed = {"call": call}
    if args.what != "cast":
        fmt = from_spec(SCHEMES[args.what][0]).fmt
        timed["cast"] = casts["float8_e4m3fn"]
        timed["own_cast"] = casts.get(fmt, casts["float8_e4m3fn"])
    walls: dict = {k: [] for k in timed}
    cpus: dict = {k: [] for k in timed}
    for _ in range(args.repeats):
        for key, f in timed.items():
            gc.collect()
            w, c = time.perf_counter(), time.process_time()
            f()
            walls[key].append(time.perf_counter() - w)
            cpus[key].append(time.process_time() - c)
    result = {"peak_increase_bytes": peak, "output_bytes": out_bytes, "input_bytes": _nbytes(x)}
    for key in timed:
        result[f"{key}_wall_s"] = statistics.median(walls[key])
        result[f"{key}_cpu_s"] = statistics.median(cpus[key])
    return result


def _casts(path: str, x) -> dict:
    """The plain casts of `x` the library has, by element format name."""
    if path == "torch":
        import torch

        return {
            "float8_e4m3fn": lambda: x.to(torch.float8_e4m3fn),
            "float8_e5m2": lambda: x.to(torch.float8_e5m2),
        }
    import ml_dtypes

    names = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")
    return {name: (lambda name=name: x.astype(getattr(ml_dtypes, name))) for name in names}


def _nbytes(a) -> int:
    return a.nbytes if hasattr(a, "nbytes") else a.numel() * a.element_size()


def _qtensor_bytes(q) -> int:
    total = _nbytes(q.codes) + _nbytes(q.scale)
    return total + (0 if q.global_scale is None else _nbytes(q.global_scale))


def _run_child(what: str, shape: str, hp_dtype: str, repeats: int, path: str) -> dict:
    argv = [sys.executable, __file__, "--child", what, "--shape", shape, "--dtypes", hp_dtype]
    argv += ["--repeats", str(repeats), "--paths", path]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{what} {hp_dtype} {shape}: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(
    scheme: str, hp_dtype: str, shape: str, repeats: int, casts: dict, path: str = "numpy"
) -> dict:
    """One row: `scheme` on `hp_dtype` input of `shape` through `path` ("numpy": the
    reference, "torch": lowp_torch on a CPU tensor); the plain cast's memory is measured
    in a child of its own (`casts` caches it by path and dtype across rows)."""
    spec, rounding = SCHEMES[scheme]
    if (path, hp_dtype) not in casts:
        casts[path, hp_dtype] = _run_child("cast", shape, hp_dtype, 1, path)
    q = _run_child(scheme, shape, hp_dtype, repeats, path)
    mib = 1 << 20
    return {
        "path": path,
        "scheme": scheme,
        "spec": spec,
        "rounding": rounding,
        "hp_dtype": hp_dtype,
        "shape": shape,
        "quantize_wall_s": round(q["call_wall_s"], 4),
        "quantize_cpu_s": round(q["call_cpu_s"], 4),
        "cast_wall_s": round(q["cast_wall_s"], 4),
        "cast_cpu_s": round(q["cast_cpu_s"], 4),
        "own_cast_cpu_s": round(q["own_cast_cpu_s"], 4),
        "time_vs_cast": round(q["call_cpu_s"] / q["cast_cpu_s"], 2),
        "time_vs_own_cast": round(q["call_cpu_s"] / q["own_cast_cpu_s"], 2),
        "peak_increase_mib": round(q["peak_increase_bytes"] / mib, 1),
        "cast_peak_increase_mib": round(casts[path, hp_dtype]["peak_increase_bytes"] / mib, 1),
        "output_mib": round(q["output_bytes"] / mib, 1),
        "input_mib": round(q["input_bytes"] / mib, 1),
        "peak_beyond_output_vs_input": round(
            (q["peak_increase_bytes"] - q["output_bytes"]) / q["input_bytes"], 2
        ),
    }


def format_row(row: dict) -> str:
    return (
        f"{row.get('path', 'numpy'):>5} {row['scheme']:>12} {row['hp_dtype']:>8} {row['shape']}: "
        f"{row['quantize_cpu_s']:7.3f} s cpu ({row['time_vs_cast']:5.2f}x the e4m3 cast, "
        f"{row['time_vs_own_cast']:5.2f}x its own), +{row['peak_increase_mib']:7.1f} MiB peak "
        f"({row['peak_beyond_output_vs_input']:5.2f}x input beyond the output)"
    )


def main(argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8192x8192")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--schemes", default=",".join(SCHEMES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="", help="also write the rows here as JSON")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--fmt", default="float8_e4m3fn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.what, args.dtype, args.path = args.child, args.dtypes, args.paths
        print(json.dumps(child(args)))
        return []
    rows, casts = [], {}
    for path in args.paths.split(","):
        for hp_dtype in args.dtypes.split(","):
            for scheme in args.schemes.split(","):
                row = measure(scheme, hp_dtype, args.shape, args.repeats, casts, path)
                print(format_row(row), flush=True)
                rows.append(row)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
