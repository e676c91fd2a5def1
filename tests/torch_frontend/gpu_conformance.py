"""lowp_torch against lowp on the GPU, eager and compiled; a JSON summary for the issue note.

Usage (from the repository root):

    PYTHONPATH=. python tests/torch_frontend/gpu_conformance.py --out DIR [--part eager|compiled|all]
        [--device cuda|cpu] [--time-budget SECONDS] [--shard K/N] [--quick]

Runs on CUDA when it is available, else on the CPU (so it can be tried anywhere). The
cases are lowp_apps.conformance's (the cross-backend suite's), at two sizes:

- eager: the full plan (every scheme x format x rank 1-4 x edge case x input dtype x
  rounding, empty tensors, every output dtype, the cuBLAS layout; --quick: the quick
  plan), then 1M random float32 inputs (magnitudes 1e-30 .. 1e30, per element and per
  16-element run) for every rank-2 scheme, nearest and stochastic, float32, bfloat16
  and float16;
- compiled: torch.compile(fullgraph=True, dynamic=False) of quantize + dequantize, one
  graph per configuration of the thin plan (every element format with every scheme
  kind and MX mode, all inputs) at one 1M-element shape, each graph fed every edge
  case and 1M random inputs; plus the thin plan at its own small rank 1-4 shapes. This
  is where Triton's approximate float32 divide, its saturating fp8 casts and FMA
  contraction would show (spec §0). A graph that cannot compile whole is an error.

Writes DIR/torch_gpu_conformance.json (rewritten as it goes, so a run cut short still
leaves its counts) with the cases run, every mismatch with its first difference (index,
input bits, both outputs) and errors. Exit status: 0 all equal, 1 any mismatch or
error, 2 stopped by --time-budget before the end (no mismatch seen). Compilation
dominates the compiled part; if it cannot finish inside one command's time, run
`--part eager` and `--part compiled` separately, and split further with `--shard 1/3`,
`--shard 2/3`, ... (each shard takes every N-th configuration; give each its own --out).
"""

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from lowp_apps.conformance import backends, cases, run

BIG_SHAPE = (256, 4096)  # 1M elements; admits every rank-2 scheme of the plans
QUICK_BIG_SHAPE = (16, 1024)
MAX_RECORDED = 200  # mismatches kept in the JSON in full; all are counted


class Run:
    """Counts, mismatches and errors, flushed to the JSON file as the run goes."""

    def __init__(self, args):
        self.args = args
        self.path = os.path.join(args.out, "torch_gpu_conformance.json")
        self.start = time.time()
        self.last_flush = 0.0
        self.summary = {
            "device": args.device,
            "device_name": torch.cuda.get_device_name()
            if args.device == "cuda"
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
            "skipped_for_time": [],
            "complete": False,
        }

    def mine(self, counter: int) -> bool:
        """Whether unit number `counter` (from 0) belongs to this shard."""
        k, n = self.args.shard
        return counter % n == k - 1

    def out_of_time(self) -> bool:
        return time.time() - self.start > self.args.time_budget

    def _section(self, section):
        return self.summary["sections"].setdefault(
            section, {"cases": 0, "mismatches": 0, "errors": 0}
        )

    def check(self, section, backend, config, label, x):
        """One case through lowp_apps.conformance.run.check, counted and recorded."""
        case_id = f"{config.id} input={label} {config.rounding_kwargs()}"
        sec = self._section(section)
        try:
            problems = run.check(backend, config, x)
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, the run goes on
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
            return
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

    def flush(self, force=False):
        now = time.time()
        if force or now - self.last_flush > 20:
            self.summary["seconds"] = round(now - self.start, 1)
            os.makedirs(self.args.out, exist_ok=True)
            with open(self.path + ".tmp", "w") as f:
                json.dump(self.summary, f, indent=1)
            os.replace(self.path + ".tmp", self.path)
            self.last_flush = now


def _version(module):
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _random_input(config, seed, chunk):
    """A random input of config's shape and dtype, magnitudes 1e-30 .. 1e30 per element
    (chunk None) or per run of `chunk` elements."""
    x = cases.random_magnitudes(config.shape, seed=seed, chunk=chunk)
    with np.errstate(over="ignore"):  # past float16's range: Inf, one more edge case
        return f"random(seed={seed}, chunk={chunk})", x.astype(cases.HP_DTYPES[config.hp_dtype])


def run_eager(r: Run, big_shape):
    backend = backends.TorchBackend(f"torch_{r.args.device}_eager", r.args.device, compiled=False)
    plan = cases.configurations("quick" if r.args.quick else "full")
    for n, config in enumerate(plan):
        if not r.mine(n):
            continue
        if r.out_of_time():
            r.summary["skipped_for_time"].append(f"eager from {config.id}")
            return
        for label, x in cases.inputs(config):
            r.check("eager", backend, config, label, x)
    for i, scheme in enumerate(cases.schemes_for_rank(2)):
        if not r.mine(i):
            continue
        if r.out_of_time():
            r.summary["skipped_for_time"].append(f"eager 1M random from {scheme}")
            return
        for j, (hp_dtype, rounding) in enumerate(cases.INPUTS):
            config = cases.Configuration(scheme, big_shape, hp_dtype, rounding)
            label, x = _random_input(config, seed=100 * i + j, chunk=16 if j % 2 else None)
            r.check("eager-1M-random", backend, config, label, x)


def run_compiled(r: Run, big_shape):
    backend = backends.TorchBackend(f"torch_{r.args.device}_compiled", r.args.device, compiled=True)
    thin = cases.configurations("thin")
    graphs = [dataclasses.replace(c, shape=big_shape) for c in thin] + thin
    for k, config in enumerate(graphs):
        if not r.mine(k):
            continue
        if r.out_of_time():
            r.summary["skipped_for_time"] += [
                c.id for i, c in enumerate(graphs) if i >= k and r.mine(i)
            ]
            return
        inputs = cases.inputs(config)
        if config.shape == big_shape:
            inputs += [
                _random_input(config, 1000 * k + c, chunk) for c, chunk in enumerate((None, 16))
            ]
        section = "compiled" if config.shape == big_shape else "compiled-small"
        for label, x in inputs:
            r.check(section, backend, config, label, x)


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
        help="the quick plan eagerly and a 16K stand-in for 1M",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch.cuda.is_available() is False")
    r = Run(args)
    big_shape = QUICK_BIG_SHAPE if args.quick else BIG_SHAPE
    r.summary["big_shape"] = list(big_shape)
    print(
        f"lowp_torch conformance on {args.device} ({r.summary['device_name']}), torch {torch.__version__}",
        flush=True,
    )
    if args.part in ("eager", "all"):
        run_eager(r, big_shape)
    if args.part in ("compiled", "all"):
        run_compiled(r, big_shape)
    r.summary["complete"] = not r.summary["skipped_for_time"]
    r.flush(force=True)
    s = r.summary
    print(
        f"{s['cases_run']} cases, {s['mismatch_count']} mismatches, {s['error_count']} errors, "
        f"complete={s['complete']} in {s['seconds']} s -> {r.path}",
        flush=True,
    )
    if s["mismatch_count"] or s["error_count"]:
        return 1
    return 0 if s["complete"] else 2


if __name__ == "__main__":
    sys.exit(main())
