"""bf16 -> fp8 casts: achieved GB/s and fraction of a same-run device copy, per path.

For each scheme, at 16384 x 16384 bfloat16 by default, three ways to run
`lowp_torch.quantize`: the fused Triton kernels in eager mode
(`cast_kernels("triton")`), the torch-ops algorithm in eager mode
(`cast_kernels("torch")`), and `torch.compile` of that algorithm (Inductor's own fused
kernels). Each is checked byte for byte against the Triton result once, then timed.

Bandwidth counts each scheme's minimum bytes moved, with n elements of b
bytes (b = 2 for bf16), K the length of a row:

    copy                      2bn        (read + write: the baseline, timed in the same run)
    tensorwise                2bn + n    (the amax needs every element before the first
                                          code, and 16384^2 does not fit in L2: two reads)
    rowwise                   bn + n + 4n/K
    rowwise_axis0             2bn + n    (column groups: an amax pass, then the cast)
    mxfp8, mxfp8_axis0        bn + n + n/32
    rowwise_both              2bn + 2n + 4n/K + 4n/R   (both orientations, `quantize_both`)
    mxfp8_both                bn + 2n + 2n/32

The "_both" rows have no torch-ops or compiled equivalent in one call; their baseline
is the sum of the two single-orientation rows. Targets (docs/performance.md): tensorwise, rowwise
and mxfp8 on the Triton path at >= 0.85 of copy.

    python bench/casts.py                              # H200: the table, JSON in bench/results/
    python bench/casts.py --tune                       # tile sizes for the Triton kernels
                                                       # (--rows to pick; default: the targets)
    TRITON_INTERPRET=1 python bench/casts.py --device cpu --shape 64x256 --iters 1   # smoke run
"""

import argparse
import dataclasses
import datetime
import itertools
import json
import pathlib
import statistics
import sys
import time
import unittest.mock

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp
import lowp_torch

RESULTS = pathlib.Path(__file__).parent / "results"
E4M3 = "float8_e4m3fn"


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    scheme: object
    both: bool = False  # quantize_both: both orientations of a 2-D tensor

    def min_bytes(self, shape, itemsize: int) -> float:
        """The minimum bytes this cast moves (module docstring)."""
        n = 1
        for d in shape:
            n *= d
        rows, cols = n // shape[-1], shape[-1]
        read, codes = itemsize * n, n
        if isinstance(self.scheme, lowp.TensorScaling):
            return 2 * read + codes
        if isinstance(self.scheme, lowp.AxisScaling):
            if self.both:
                return 2 * read + 2 * codes + 4 * rows + 4 * cols
            if self.scheme.axis in (-1, len(shape) - 1):
                return read + codes + 4 * rows
            return 2 * read + codes + 4 * cols
        scales = n // self.scheme.block
        return read + codes * (2 if self.both else 1) + scales * (2 if self.both else 1)


ROWS = [
    Row("tensorwise", lowp.TensorScaling(E4M3)),
    Row("tensorwise_e5m2", lowp.TensorScaling("float8_e5m2")),
    Row("rowwise", lowp.AxisScaling(E4M3)),
    Row("rowwise_pow2", lowp.AxisScaling(E4M3, pow2=True)),
    Row("rowwise_axis0", lowp.AxisScaling(E4M3, axis=0, pow2=True)),
    Row("mxfp8", lowp.MXScaling(E4M3, mode="rceil")),
    Row("mxfp8_axis0", lowp.MXScaling(E4M3, mode="rceil", axis=0)),
    Row("rowwise_both", lowp.AxisScaling(E4M3, pow2=True), both=True),
    Row("mxfp8_both", lowp.MXScaling(E4M3, mode="rceil"), both=True),
]
TARGETS = {"tensorwise": 0.85, "rowwise": 0.85, "mxfp8": 0.85}
# --tune: the tile settings (module constants of lowp_torch._triton_casts) tried for
# each row; every combination of one row's settings is timed.
_TILES_2D = ((16, 256), (32, 256), (32, 128), (64, 128), (8, 512), (16, 512))
_PER_THREAD = (8, 16, 32)
TUNE_GRID = {
    "tensorwise": {
        "_FLAT_BLOCK": (2048, 4096, 8192),
        "_ELEMENTS_PER_THREAD": _PER_THREAD,
        "_AMAX_PROGRAMS": (1024, 4096),
    },
    "rowwise": {
        "_ROWS_ONE_PASS": (4096, 8192, 16384),
        "_ROWS_CHUNK": (2048, 4096, 8192),
        "_ROWS_ELEMENTS_PER_THREAD": _PER_THREAD,
    },
    "rowwise_axis0": {
        "_TILE_COLS": ((64, 64), (32, 64), (64, 32), (128, 32), (32, 32), (128, 64)),
        "_COLS_ELEMENTS_PER_THREAD": _PER_THREAD,
        "_AMAX_ROW_TILES": (4, 16),
    },
    "mxfp8": {"_TILE": _TILES_2D, "_ELEMENTS_PER_THREAD": _PER_THREAD},
    "mxfp8_axis0": {
        "_TILE_COLS": ((32, 128), (64, 64), (32, 64), (64, 32), (128, 32), (32, 32)),
        "_COLS_ELEMENTS_PER_THREAD": _PER_THREAD,
    },
}
TUNE_GRID["rowwise_pow2"] = TUNE_GRID["rowwise"]
TUNE_GRID["tensorwise_e5m2"] = TUNE_GRID["tensorwise"]
# The both-orientations cast's own tile was tuned on the H200 ((64, 64), 32 a thread);
# its amax pass's tile is tried apart from it (`_triton_casts._AMAX_TILE`).
_AMAX_TILES = (None, (32, 256), (16, 512), (64, 256), (128, 128))
TUNE_GRID["rowwise_both"] = {"_AMAX_TILE": _AMAX_TILES, "_AMAX_ROW_TILES": (4, 16)}
TUNE_GRID["mxfp8_both"] = TUNE_GRID["mxfp8_axis0"]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device, iters: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean time of `iters` calls, in milliseconds."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - start) * 1e3 / iters)
    return statistics.median(samples)


def _bytes_of(q) -> list:
    """Codes and scales of a QuantizedTensor as uint8 views, for a byte comparison."""
    return [t.contiguous().reshape(-1).view(torch.uint8) for t in (q.codes, q.scale)]


def _same_bytes(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_bytes_of(a), _bytes_of(b), strict=True))


def _callables(row: Row, x, paths):
    """path -> a no-argument function running the cast, for the paths that apply."""
    from lowp_torch import _triton_casts

    scheme = row.scheme
    out = {}
    if "triton" in paths:
        if row.both:
            out["triton"] = lambda: _triton_casts.quantize_both(x, scheme)
        else:

            def triton_path():
                with lowp_torch.cast_kernels("triton"):
                    return lowp_torch.quantize(x, scheme)

            out["triton"] = triton_path
    if row.both:
        return out  # no single torch call makes both orientations

    if "eager" in paths:

        def eager_path():
            with lowp_torch.cast_kernels("torch"):
                return lowp_torch.quantize(x, scheme)

        out["eager"] = eager_path
    if "compile" in paths:
        compiled = torch.compile(
            lambda t: lowp_torch.quantize(t, scheme), fullgraph=True, dynamic=False
        )
        out["compile"] = lambda: compiled(x)
    return out


def _torch_ops(row: Row, x) -> dict:
    """{"eager": the torch-ops path's result} for `_check`; {} for a "_both" row, which
    `_check` compares with the torch ops itself."""
    if row.both:
        return {}
    return {"eager": _callables(row, x, ["eager"])["eager"]()}


def _check(row: Row, results: dict) -> str:
    """'ok' if every path wrote the Triton path's bytes, else which did not."""
    if "triton" not in results:
        return "not checked"
    reference = results["triton"]
    if row.both:
        # Each orientation against the torch-ops path of that orientation.
        along_first = dataclasses.replace(row.scheme, axis=-2)
        x = results["input"]
        with lowp_torch.cast_kernels("torch"):
            want = (lowp_torch.quantize(x, row.scheme), lowp_torch.quantize(x, along_first))
        same = all(_same_bytes(a, b) for a, b in zip(reference, want, strict=True))
        return "ok" if same else "MISMATCH vs torch ops"
    bad = [
        p
        for p, q in results.items()
        if p not in ("triton", "input") and not _same_bytes(q, reference)
    ]
    return "ok" if not bad else "MISMATCH: " + ",".join(bad)


def run(args) -> dict:
    device = torch.device(args.device)
    shape = tuple(int(d) for d in args.shape.split("x"))
    hp_dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    x = torch.randn(shape, device=device, dtype=torch.float32).to(hp_dtype)
    itemsize = x.element_size()
    copy_dst = torch.empty_like(x)
    copy_ms = time_ms(lambda: copy_dst.copy_(x), device, args.iters)
    copy_gbs = 2 * itemsize * x.numel() / (copy_ms * 1e-3) / 1e9
    print(f"copy {args.shape} {args.dtype}: {copy_ms:.4f} ms, {copy_gbs:.0f} GB/s", flush=True)
    paths = args.paths.split(",")
    names = args.rows.split(",") if args.rows else [r.name for r in ROWS]
    table = []
    for row in (r for r in ROWS if r.name in names):
        fns = _callables(row, x, paths)
        results = {path: fn() for path, fn in fns.items()}
        results["input"] = x
        check = _check(row, results)
        del results
        nbytes = row.min_bytes(shape, itemsize)
        for path, fn in fns.items():
            ms = time_ms(fn, device, args.iters)
            gbs = nbytes / (ms * 1e-3) / 1e9
            entry = {
                "scheme": row.name,
                "path": path,
                "ms": round(ms, 4),
                "min_bytes": int(nbytes),
                "gb_per_s": round(gbs, 1),
                "fraction_of_copy": round(gbs / copy_gbs, 3),
                "bytes_check": check,
            }
            table.append(entry)
            print(_format(entry), flush=True)
        torch._dynamo.reset()
    return {
        "torch": torch.__version__,
        "triton": _version("triton"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": list(shape),
        "dtype": args.dtype,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "copy": {"ms": round(copy_ms, 4), "gb_per_s": round(copy_gbs, 1)},
        "rows": table,
        "cast_fraction_of_copy": {
            e["scheme"]: e["fraction_of_copy"]
            for e in table
            if e["path"] == "triton" and e["scheme"] in TARGETS
        },
    }


def tune(args) -> dict:
    """Every combination of each row's TUNE_GRID on the Triton path, each checked byte
    for byte against the torch-ops path; the best per row of those that match."""
    from lowp_torch import _triton_casts

    device = torch.device(args.device)
    shape = tuple(int(d) for d in args.shape.split("x"))
    x = torch.randn(shape, device=device, dtype=torch.float32).to(getattr(torch, args.dtype))
    names = args.rows.split(",") if args.rows else list(TARGETS)
    best = {}
    for row in (r for r in ROWS if r.name in names):
        grid = TUNE_GRID[row.name]
        for values in itertools.product(*grid.values()):
            setting = dict(zip(grid, values, strict=True))
            with unittest.mock.patch.multiple(_triton_casts, **setting):
                fn = _callables(row, x, ["triton"])["triton"]
                check = _check(row, {"triton": fn(), "input": x, **_torch_ops(row, x)})
                ms = time_ms(fn, device, args.iters, repeats=3)
            print(f"{row.name:>16} {setting}: {ms:.4f} ms [{check}]", flush=True)
            if check == "ok" and (row.name not in best or ms < best[row.name]["ms"]):
                best[row.name] = {"ms": round(ms, 4), "setting": setting}
    for name, b in best.items():
        print(f"best {name:>16}: {b['ms']:.4f} ms with {b['setting']}")
    return {"tune": best}


def _format(e) -> str:
    return (
        f"{e['scheme']:>16} {e['path']:>8}: {e['ms']:9.4f} ms {e['gb_per_s']:8.1f} GB/s "
        f"{e['fraction_of_copy']:6.3f} of copy  [{e['bytes_check']}]"
    )


def _version(name):
    try:
        return __import__(name).__version__
    except ImportError:
        return None


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="16384x16384")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--paths", default="triton,eager,compile", help="comma list")
    parser.add_argument("--rows", default="", help="comma list of scheme rows (default: all)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tune", action="store_true", help="sweep tile sizes (Triton path)")
    parser.add_argument("--out", default="", help="JSON path (default: bench/results/...)")
    args = parser.parse_args(argv)
    result = tune(args) if args.tune else run(args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    kind = "tune" if args.tune else "casts"
    out = (
        pathlib.Path(args.out)
        if args.out
        else RESULTS / f"{kind}_{args.device.split(':')[0]}_{stamp}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
