"""lowp_torch against lowp on the GPU, eager and compiled; a JSON summary for the issue note.

Usage (from the repository root):

    PYTHONPATH=. python tests/torch_frontend/gpu_conformance.py --out DIR [--part eager|compiled|all]
        [--device cuda|cpu] [--time-budget SECONDS] [--shard K/N] [--quick]

Runs on CUDA when it is available, else on the CPU (so it can be tried anywhere):

- eager: every case of tests/torch_frontend/test_torch_conformance.py (every scheme x format x rank 1-4
  x edge case x input dtype x rounding, empty tensors), then 1M random float32 inputs
  (magnitudes 1e-30 .. 1e30, per element and per 16-element run) for every rank-2
  scheme, nearest and stochastic, float32, bfloat16 and float16;
- compiled: torch.compile(fullgraph=True, dynamic=False) of quantize + dequantize, one
  graph per (scheme, dtype, rounding) at one 1M-element shape, each graph fed every edge
  case and 1M random inputs; every element format meets every scheme kind and MX mode
  there; plus small rank-1/3/4 graphs. This is where Triton's approximate float32
  divide, its saturating fp8 casts and FMA contraction would show (spec §0).

Writes DIR/torch_gpu_conformance.json (rewritten as it goes, so a run cut short still
leaves its counts) with the cases run, every mismatch with its first difference (index,
input float32 bits, both outputs), errors and graph breaks. Exit status: 0 all equal,
1 any mismatch or error, 2 stopped by --time-budget before the end (no mismatch seen).
Compilation dominates the compiled part; if it cannot finish inside one command's time,
run `--part eager` and `--part compiled` separately, and split further with
`--shard 1/3`, `--shard 2/3`, ... (each shard takes every N-th scheme or graph; give
each its own --out).
"""

import argparse
import json
import os
import platform
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch_cases as tc

import lowp

INPUTS = [
    ("float32", "nearest"),
    ("float32", "stochastic"),
    ("bfloat16", "nearest"),
    ("float16", "nearest"),
]
BIG_SHAPE = (256, 4096)  # 1M elements; admits every rank-2 scheme of torch_cases
QUICK_BIG_SHAPE = (16, 1024)
MAX_RECORDED = 200  # mismatches kept in the JSON in full; all are counted


def compiled_schemes() -> list:
    """Every element format with every scheme kind, pow2 on and off, every MX mode, axis 0
    and -1, and the NVFP4 variants: 23 schemes, each compiled for both roundings."""
    out = []
    for i, fmt in enumerate(tc.ELEMENTS):
        out.append(lowp.TensorScaling(fmt, pow2=bool(i % 2)))
        out.append(lowp.AxisScaling(fmt, axis=0 if i % 2 == 0 else -1, pow2=not i % 2))
        out.append(lowp.BlockScaling(fmt, block=(3, 5) if i % 2 else (2, 4), pow2=bool(i % 2)))
        out.append(lowp.MXScaling(fmt, block=8 if i % 2 else 32, mode=tc.MX_MODES[i % 3]))
    out.append(lowp.MXScaling("float8_e5m2", block=2, mode="rceil", axis=0))
    out += [lowp.NVFP4Scaling(), lowp.NVFP4Scaling(global_scale=False), lowp.NVFP4Scaling(block=8)]
    return out


# bfloat16 / float16 inputs compiled for one scheme of each kind.
DTYPE_SCHEMES = [
    lowp.TensorScaling("float8_e4m3fn"),
    lowp.AxisScaling("float8_e5m2", pow2=True),
    lowp.BlockScaling("float8_e4m3fn", block=(1, 128)),
    lowp.MXScaling("float8_e4m3fn", mode="rceil"),
    lowp.MXScaling("float4_e2m1fn", mode="floor"),
    lowp.NVFP4Scaling(),
]
SMALL_COMPILED = [
    lowp.TensorScaling("float8_e4m3fn"),
    lowp.MXScaling("float6_e2m3fn", block=8, mode="rceil"),
    lowp.NVFP4Scaling(),
]


class Run:
    """Counts, mismatches and errors, flushed to the JSON file as the run goes."""

    def __init__(self, args, device):
        self.args, self.device = args, device
        self.path = os.path.join(args.out, "torch_gpu_conformance.json")
        self.start = time.time()
        self.last_flush = 0.0
        self.summary = {
            "device": device,
            "device_name": torch.cuda.get_device_name()
            if device == "cuda"
            else platform.platform(),
            "torch": torch.__version__,
            "triton": _version("triton"),
            "numpy": np.__version__,
            "part": args.part,
            "shard": "{}/{}".format(*args.shard),
            "quick": args.quick,
            "cases_run": 0,
            "mismatch_count": 0,
            "error_count": 0,
            "sections": {},
            "mismatches": [],
            "errors": [],
            "graph_breaks": [],
            "skipped_for_time": [],
            "complete": False,
        }

    def mine(self, counter: int) -> bool:
        """Whether unit number `counter` belongs to this shard."""
        k, n = self.args.shard
        return counter % n == k - 1

    def out_of_time(self) -> bool:
        return time.time() - self.start > self.args.time_budget

    def record(self, section, case_id, problems):
        sec = self.summary["sections"].setdefault(
            section, {"cases": 0, "mismatches": 0, "errors": 0}
        )
        sec["cases"] += 1
        self.summary["cases_run"] += 1
        if problems:
            sec["mismatches"] += 1
            self.summary["mismatch_count"] += 1
            if len(self.summary["mismatches"]) < MAX_RECORDED:
                self.summary["mismatches"].append(
                    {"section": section, "case": case_id, "first_differences": problems[:8]}
                )
            print(f"MISMATCH {section} {case_id}\n  " + "\n  ".join(problems[:3]), flush=True)
        self.flush()

    def error(self, section, case_id, exc):
        sec = self.summary["sections"].setdefault(
            section, {"cases": 0, "mismatches": 0, "errors": 0}
        )
        sec["errors"] += 1
        self.summary["error_count"] += 1
        if len(self.summary["errors"]) < MAX_RECORDED:
            self.summary["errors"].append(
                {
                    "section": section,
                    "case": case_id,
                    "error": repr(exc)[:2000],
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
        print(f"ERROR {section} {case_id}: {exc!r}"[:500], flush=True)
        self.flush(force=True)

    def flush(self, force=False):
        now = time.time()
        if force or now - self.last_flush > 20:
            self.summary["seconds"] = round(now - self.start, 1)
            os.makedirs(self.args.out, exist_ok=True)
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.summary, f, indent=1)
            os.replace(self.path + ".tmp", self.path)
            self.last_flush = now

    def check(self, section, case_id, roundtrip, scheme, x32, hp_dtype, kwargs, extras=False):
        try:
            problems = tc.check_case(
                roundtrip, scheme, x32, hp_dtype, kwargs, self.device, extras=extras
            )
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, the run goes on
            self.error(section, case_id, exc)
            return False
        self.record(section, case_id, problems)
        return True


def _version(module):
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _case_id(scheme, shape, case, hp_dtype, rounding, kwargs):
    return f"{scheme} shape={shape} input={case} {hp_dtype} {rounding} {kwargs}"


def run_eager(run: Run, big_shape):
    section = "eager"
    unit = 0
    for rank, shape in tc.SHAPES.items():
        for scheme in tc.schemes_for_rank(rank):
            unit += 1
            if not run.mine(unit):
                continue
            if run.out_of_time():
                run.summary["skipped_for_time"].append(f"eager rank {rank} from {scheme}")
                return
            for case in tc.EDGE_CASES:
                for variant in range(tc.VARIANTS.get(case, 1)):
                    x32 = tc.make_input(case, shape, scheme, variant)
                    for hp_dtype, rounding in INPUTS:
                        kwargs = tc.rounding_kwargs(rounding, variant)
                        run.check(
                            section,
                            _case_id(scheme, shape, f"{case}{variant}", hp_dtype, rounding, kwargs),
                            tc.eager_roundtrip(scheme, kwargs),
                            scheme,
                            x32,
                            hp_dtype,
                            kwargs,
                            extras=(hp_dtype, rounding) == ("float32", "nearest"),
                        )
            empty = np.zeros(tc.EMPTY_SHAPES[rank], np.float32)
            for hp_dtype, rounding in INPUTS:
                kwargs = tc.rounding_kwargs(rounding)
                run.check(
                    section,
                    _case_id(scheme, empty.shape, "empty", hp_dtype, rounding, kwargs),
                    tc.eager_roundtrip(scheme, kwargs),
                    scheme,
                    empty,
                    hp_dtype,
                    kwargs,
                    extras=True,
                )
    section = "eager-1M-random"
    for i, scheme in enumerate(tc.schemes_for_rank(2)):
        if not run.mine(i + 1):
            continue
        if run.out_of_time():
            run.summary["skipped_for_time"].append(f"eager 1M random from {scheme}")
            return
        for j, (hp_dtype, rounding) in enumerate(INPUTS):
            chunk = 16 if j % 2 else None
            x32 = tc.random_magnitudes(big_shape, seed=100 * i + j, chunk=chunk)
            kwargs = tc.rounding_kwargs(rounding, i)
            run.check(
                section,
                _case_id(
                    scheme,
                    big_shape,
                    f"random(seed={100 * i + j}, chunk={chunk})",
                    hp_dtype,
                    rounding,
                    kwargs,
                ),
                tc.eager_roundtrip(scheme, kwargs),
                scheme,
                x32,
                hp_dtype,
                kwargs,
            )


def _compiled_graph(run: Run, section, scheme, shape, hp_dtype, rounding, inputs):
    """Compile one roundtrip (fullgraph; on a graph break, record it and retry without)
    and feed it every input: [(label, x32)]."""
    kwargs = tc.rounding_kwargs(rounding)
    graph_id = f"{scheme} shape={shape} {hp_dtype} {rounding}"
    roundtrip = tc.compiled_roundtrip(scheme, kwargs, fullgraph=True)
    for n, (label, x32) in enumerate(inputs):
        case_id = _case_id(scheme, shape, label, hp_dtype, rounding, kwargs)
        if n == 0:
            try:
                roundtrip(tc.to_torch(x32, hp_dtype, run.device))
            except Exception as exc:  # noqa: BLE001 - a graph break under fullgraph, or worse
                run.summary["graph_breaks"].append({"graph": graph_id, "error": repr(exc)[:2000]})
                print(f"fullgraph failed for {graph_id}: {exc!r}"[:500], flush=True)
                roundtrip = tc.compiled_roundtrip(scheme, kwargs, fullgraph=False)
                try:
                    roundtrip(tc.to_torch(x32, hp_dtype, run.device))
                except Exception as exc2:  # noqa: BLE001
                    run.error(section, f"compiling {graph_id}", exc2)
                    return
        run.check(section, case_id, roundtrip, scheme, x32, hp_dtype, kwargs)


def run_compiled(run: Run, big_shape, quick):
    import torch._dynamo.config as dynamo_config

    # Every compiled closure shares one code object and so one recompile budget.
    for key, value in {
        "recompile_limit": 100_000,
        "cache_size_limit": 100_000,
        "fail_on_recompile_limit_hit": True,
    }.items():
        if hasattr(dynamo_config, key):
            setattr(dynamo_config, key, value)
    schemes = compiled_schemes()
    if quick:  # one of each kind
        schemes = schemes[::5] + [lowp.NVFP4Scaling()]
    graphs = [(s, "float32", r) for s in schemes for r in ("nearest", "stochastic")]
    graphs += [(s, d, "nearest") for s in DTYPE_SCHEMES for d in ("bfloat16", "float16")]
    for k, (scheme, hp_dtype, rounding) in enumerate(graphs):
        if not run.mine(k + 1):
            continue
        if run.out_of_time():
            run.summary["skipped_for_time"] += [
                f"compiled {s} {d} {r}"
                for i, (s, d, r) in enumerate(graphs)
                if i >= k and run.mine(i + 1)
            ]
            return
        inputs = [
            (f"{case}{v}", tc.make_input(case, big_shape, scheme, v))
            for case in tc.EDGE_CASES
            for v in range(tc.VARIANTS.get(case, 1))
        ]
        inputs += [
            (
                f"random(seed={1000 * k + c}, chunk={chunk})",
                tc.random_magnitudes(big_shape, seed=1000 * k + c, chunk=chunk),
            )
            for c, chunk in enumerate((None, 16))
        ]
        _compiled_graph(run, "compiled", scheme, big_shape, hp_dtype, rounding, inputs)
    for rank in (1, 3, 4):
        for j, scheme in enumerate(SMALL_COMPILED):
            if not run.mine(len(graphs) + 3 * rank + j):
                continue
            if run.out_of_time():
                run.summary["skipped_for_time"].append(f"compiled small rank {rank} {scheme}")
                return
            shape = tc.SHAPES[rank]
            inputs = [
                (f"{case}{v}", tc.make_input(case, shape, scheme, v))
                for case in tc.EDGE_CASES
                for v in range(tc.VARIANTS.get(case, 1))
            ]
            _compiled_graph(run, "compiled-small", scheme, shape, "float32", "nearest", inputs)


def _shard(text: str) -> tuple[int, int]:
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"--shard takes K/N with 1 <= K <= N, got {text!r}")
    return int(k), int(n)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for torch_gpu_conformance.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--part", choices=("eager", "compiled", "all"), default="all")
    parser.add_argument(
        "--time-budget", type=float, default=540.0, help="seconds; then stop and exit 2"
    )
    parser.add_argument(
        "--shard", type=_shard, default=(1, 1), help="K/N: run the K-th of N interleaved shares"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a 16K stand-in for 1M and one compiled scheme of each kind",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch.cuda.is_available() is False")
    run = Run(args, args.device)
    big_shape = QUICK_BIG_SHAPE if args.quick else BIG_SHAPE
    run.summary["big_shape"] = list(big_shape)
    print(
        f"lowp_torch conformance on {args.device} ({run.summary['device_name']}), torch {torch.__version__}",
        flush=True,
    )
    if args.part in ("eager", "all"):
        run_eager(run, big_shape)
    if args.part in ("compiled", "all"):
        run_compiled(run, big_shape, args.quick)
    run.summary["complete"] = not run.summary["skipped_for_time"]
    run.flush(force=True)
    s = run.summary
    print(
        f"{s['cases_run']} cases, {s['mismatch_count']} mismatches, {s['error_count']} errors, "
        f"{len(s['graph_breaks'])} graph breaks, complete={s['complete']} in {s['seconds']} s -> {run.path}",
        flush=True,
    )
    if s["mismatch_count"] or s["error_count"]:
        return 1
    return 0 if s["complete"] else 2


if __name__ == "__main__":
    sys.exit(main())
