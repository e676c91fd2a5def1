"""lowp_jax against lowp, byte for byte, on whatever device jax picks (the GPU there).

    PYTHONPATH=. python tests/jax_frontend/gpu_conformance.py --out DIR [--quick]

Runs, on jax's default device:
  1. the exact divide `div_rn` on 1M pairs (random, subnormal/overflow boundaries) and the
     narrow multiply on products at the flush boundary, against NumPy; for comparison, the
     count of JAX's own `/` results that differ from IEEE on this device;
  2. 1M random float32 inputs per scheme (default block sizes) with magnitudes over the
     whole float32 range, many groups each, so the scale divisions see every exponent;
     plus stochastic rounding on a few of them;
  3. the cross-backend suite's quick plan (lowp_apps.conformance): every scheme x format x
     rank 1-4 on the spec §6 edge cases, bfloat16/float16 inputs, stochastic rounding,
     empty tensors, every output dtype and the cuBLAS layout in part.
Writes DIR/jax_gpu_conformance.json (after each part, so a run cut short still reports)
and exits 1 on any mismatch of lowp_jax, or when a --time-limit cut the grid short (the
native `/` count is informational). --quick runs a slice of each part (the thin plan
for part 3).
"""

import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax_cases as C

import lowp
from lowp_apps.conformance import backends, cases, run
from lowp_jax import _exact

RANDOM_SHAPE = (8192, 128)  # 1M elements; 8192 rows of 128


def random_schemes():
    """Default block sizes: the shapes a model would use."""
    out = []
    for fmt in cases.ELEMENTS:
        out += [lowp.TensorScaling(fmt), lowp.TensorScaling(fmt, pow2=True), lowp.AxisScaling(fmt)]
        out += [lowp.AxisScaling(fmt, axis=0, pow2=True), lowp.BlockScaling(fmt, block=(1, 128))]
        out += [lowp.BlockScaling(fmt, block=(128, 128))]
        out += [lowp.MXScaling(fmt, mode=m) for m in ("floor", "ceil", "rceil")]
    return out + [lowp.NVFP4Scaling(), lowp.NVFP4Scaling(global_scale=False)]


def random_input(rng, shape=RANDOM_SHAPE) -> np.ndarray:
    """Random signs and mantissas; per-row magnitudes 2**[-126, 100) and per-element spread
    2**[-24, 24), so group amaxes (and the divisions of their scales) span the float32
    range; a few rows hold a NaN or an Inf (poisoned groups)."""
    rows = shape[0]
    row_exp = rng.integers(-126, 100, size=(rows, 1))
    x = rng.uniform(1, 2, shape) * np.exp2(row_exp + rng.integers(-24, 24, size=shape))
    x *= rng.choice([-1.0, 1.0], size=shape)
    x = x.astype(np.float32)  # values past FLT_MAX become Inf: poisoned groups, fine
    bad_rows = rng.choice(rows, size=8, replace=False)
    x[bad_rows, rng.integers(0, shape[1], 8)] = [np.nan, np.inf, -np.inf, np.nan] * 2
    return x


def _check(backend, config, x, label, failures) -> list[str]:
    """lowp_apps.conformance's byte comparison of one case; a failure is described in `failures`."""
    problems = run.check(backend, config, x)
    if problems:
        failures.append(f"[{label}] {config.id}:\n  " + "\n  ".join(problems))
    return problems


def main(argv=None) -> int:
    start = time.time()

    def write(report, failures) -> str:
        """(Re)write the JSON: after each part, so a run cut short still reports."""
        report["failures"] = failures[:100]
        report["failure_count"] = len(failures)
        report["passed"] = not failures and report.get("complete", False)
        report["seconds"] = round(time.time() - start, 1)
        path = os.path.join(args.out, "jax_gpu_conformance.json")
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
        return path

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for jax_gpu_conformance.json")
    parser.add_argument("--quick", action="store_true", help="a slice of each part")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=0,
        help="seconds after which the edge-case grid stops early (reported as truncated)",
    )
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    np.seterr(all="ignore")
    device = jax.devices()[0]
    report = {
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or __import__("jaxlib").__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device": str(device),
        "device_kind": getattr(device, "device_kind", "?"),
        "all_devices": [str(d) for d in jax.devices()],
        "x64": bool(jax.config.jax_enable_x64),
        "quick": args.quick,
    }
    failures = []
    where = f"{report['device_kind']} ({report['backend']})"
    print(f"lowp_jax conformance on {where}, jax {report['jax']}", flush=True)

    # 1. the exact divide and the narrow multiply, and the native `/` for comparison
    t = time.time()
    a, b = C.divide_pairs(np.random.default_rng(7), 1_000_000)
    a_dev, b_dev = jax.device_put((a, b), device)
    want = C.reference_divide(a, b)
    div_rn_diff = C.count_bit_differences(jax.jit(_exact.div_rn)(a_dev, b_dev), want)
    native = jax.jit(lambda a, b: a / b)(a_dev, b_dev)
    finite_normal = np.isfinite(want) & (want != 0)  # where the native result should equal IEEE
    native_diff = C.count_bit_differences(
        C.ftz(np.asarray(native))[finite_normal], want[finite_normal]
    )
    values = np.concatenate([lowp.FORMATS[f].values() for f in lowp.ELEMENT_FORMATS])
    m_rng = np.random.default_rng(8)
    ma = m_rng.choice(values[np.isfinite(values)], 1_000_000).astype(np.float32)
    with np.errstate(all="ignore"):
        target = (np.float64(2.0**-126) / np.where(ma != 0, np.abs(ma), 1)).astype(np.float32)
    mb = (target.view(np.uint32).astype(np.int64) + m_rng.integers(-3, 4, ma.size)).clip(
        0, 0x7F7FFFFF
    )
    mb = mb.astype(np.uint32).view(np.float32)
    mul_got = jax.jit(_exact.mul_narrow)(*jax.device_put((ma, mb), device))
    with np.errstate(all="ignore"):
        mul_want = C.ftz(np.multiply(C.ftz(ma), C.ftz(mb), dtype=np.float32))
    mul_diff = C.count_bit_differences(mul_got, mul_want)
    report["exact_arithmetic"] = {
        "div_rn_pairs": int(a.size),
        "div_rn_differences": div_rn_diff,
        "native_div_compared": int(finite_normal.sum()),
        "native_div_differences_informational": native_diff,
        "mul_narrow_products_at_flush_boundary": int(ma.size),
        "mul_narrow_differences": mul_diff,
        "seconds": round(time.time() - t, 1),
    }
    if div_rn_diff:
        failures.append(f"[div_rn] {div_rn_diff} of {a.size} quotients differ from IEEE")
    if mul_diff:
        failures.append(f"[mul_narrow] {mul_diff} of {ma.size} products differ from IEEE")
    compared = int(finite_normal.sum())
    print(
        f"  div_rn: {div_rn_diff} differences; native '/': {native_diff} of {compared}", flush=True
    )
    write(report, failures)

    # 2. one million random inputs per scheme
    backend = backends.JaxBackend(f"jax_{device.platform}", device.platform)
    t = time.time()
    rng = np.random.default_rng(2024)
    random_runs = [(s, "nearest") for s in random_schemes()[:: 6 if args.quick else 1]]
    random_runs += [
        (lowp.AxisScaling("float8_e5m2"), "stochastic"),
        (lowp.MXScaling("float6_e2m3fn", mode="rceil"), "stochastic"),
        (lowp.NVFP4Scaling(), "stochastic"),
    ]
    # Many small groups: 262144 rows of 4, each with its own pair of scale divisions.
    random_runs.append((lowp.AxisScaling(), "nearest", (262144, 4)))
    random_results = []
    for scheme, rounding, *shape in random_runs:
        x = random_input(rng, *shape)
        config = cases.Configuration(scheme, x.shape, "float32", rounding)
        errors = _check(backend, config, x, "1M random", failures)
        random_results.append({"case": config.id, "elements": x.size, "differences": errors})
    report["random_1M"] = {"results": random_results, "seconds": round(time.time() - t, 1)}
    write(report, failures)
    print(
        f"  1M random inputs: {len(random_results)} runs, {len(failures)} failing in total",
        flush=True,
    )

    # 3. the edge-case grid, last: it is the longest (one compilation per configuration)
    count = 0
    t = time.time()
    plan = cases.configurations("thin" if args.quick else "quick")
    done = 0
    for n, config in enumerate(plan):
        if args.time_limit and time.time() - start > args.time_limit:
            print(
                f"  time limit: stopping the grid after {n} of {len(plan)} configurations",
                flush=True,
            )
            break
        done = n + 1
        for name, x in cases.inputs(config):
            _check(backend, config, x, f"grid {name}", failures)
            count += 1
        if n % 50 == 0:
            print(
                f"  grid {n}/{len(plan)} configurations, {len(failures)} failing cases", flush=True
            )
    report["grid"] = {
        "configurations": len(plan),
        "configurations_run": done,
        "truncated_by_time_limit": done < len(plan),
        "cases": count,
        "seconds": round(time.time() - t, 1),
    }
    write(report, failures)

    report["complete"] = not report["grid"]["truncated_by_time_limit"]
    path = write(report, failures)
    status = (
        "FAIL"
        if failures
        else "INCOMPLETE (time limit)"
        if report["grid"]["truncated_by_time_limit"]
        else "PASS"
    )
    print(
        f"{status}: {count} edge cases, {len(random_results)} x 1M random, "
        f"{len(failures)} failures, {report['seconds']} s -> {path}"
    )
    for line in failures[:10]:
        print(line)
    return 0 if report["passed"] and not report["grid"]["truncated_by_time_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
