"""Where the time of lowp_jax's fp8 training step goes, next to flax's: the dense
layer's forward + backward taken apart, every part timed side by side in one run.

For each recipe, at each shape (M, K, N), these jitted calls:

    step      the whole forward + backward (`jax_training`: flax Dense, lowp's dot)
    casts     every quantized operand of the three GEMMs, as the step computes them
              (`lowp_jax.training_operands`: amax passes, casts, transposes)
    gemms     the recipe's three GEMMs on those operands, given as inputs: lowp's fp8
              dot (float32 output, then the decode scales and one rounding to bf16)
    raw       the same three fp8 dots writing bf16 with no scale at all: the GEMM
              hardware's floor, what no scaled form can beat

and, once a shape, the bf16 step and flax's `Fp8DirectDotGeneralOp` step (delayed
scaling: its casts reuse last step's scale, so the amax fuses into the cast; its dots
write bf16 and are scaled in bf16). So `step - casts - gemms` is what fusing the parts
saves or costs, `gemms - raw` the price of lowp's float32 output, and
`flax - raw` what flax spends outside the GEMMs.

    python bench/probes/jax_step_parts.py                       # H200: the two LLM shapes
    python bench/probes/jax_step_parts.py --variants xT_copy  # also without the transposed cast kernel
    python bench/probes/jax_step_parts.py --shapes 256x512x384 --recipes float8_tensorwise  # CPU smoke
    python bench/probes/jax_step_parts.py --variants f32_out --no-parts  # steps only
    python bench/probes/jax_step_parts.py --trace --shapes 16384x8192x8192  # device trace instead

--trace times nothing: it runs the steps (bf16, flax's, each recipe's) under
`jax.profiler.trace` and sums the device's events a step from the Perfetto trace: each
kernel's time and count, the stream's busy time (the union of its kernels) and the step's
span on the device, so that a step longer than its parts shows whether the device idles
(the host or a dependency) or runs kernels the parts do not have.
"""

import argparse
import collections
import contextlib
import gzip
import json
import pathlib
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp_jax
from bench import _timing, jax_training
from lowp_apps.conformance import gemm as _gemm_conformance

RECIPES = ("float8_tensorwise", "float8_rowwise", "float8_rowwise_gw_hp")
SHAPES = ((16384, 4096, 14336), (16384, 8192, 8192))
A_BT = (((1,), (1,)), ((), ()))
GEMMS = ("forward", "dgrad", "wgrad")
# Step variants: a lowp_jax switch set away from its default while the step is traced
# (a function returning its `with` block), and the recipes whose step it changes.
# "xT_copy": the backward's transposed rowwise operands from a high-precision x.T copy
# instead of the transposed cast kernel. A variant step's row says how its y, dx and dw
# differ from the default step's (`outputs_differ`).
VARIANTS = {
    # float8_rowwise_gw_hp has no transposed rowwise operand: its dgrad's w is tensorwise
    "xT_copy": (lambda: lowp_jax.cast_kernels("auto", transposed=False), ("float8_rowwise",)),
    # the fp8 GEMM writing float32 where the default writes bfloat16 (`_dot._fp8_dot`)
    "f32_out": (lambda: lowp_jax.gemm_output("float32"), ("float8_tensorwise",)),
}


def step_label(recipe: str, variant: str | None = None) -> str:
    """A row's "recipe": the recipe, and the variant its step ran under in brackets."""
    return recipe + (f" ({variant})" if variant else "")


def switched(variant: str | None):
    """lowp_jax with `variant`'s switch set (no change for None), restored after."""
    if variant is None:
        return contextlib.nullcontext()
    block, _ = VARIANTS[variant]
    return block()


def step_call(impl: str, recipe: str | None, x, w, dy, variant: str | None = None):
    """((the compiled forward + backward of `jax_training`, its arguments), how many
    transposed cast kernels it runs), with the kernel `w` (N, K) as the layer's (K, N)
    parameter, traced under `variant` (a key of VARIANTS, or None: lowp_jax as it is)."""
    # small_shapes="quantize": the parts are the recipe's, so the step must be too, at
    # any shape (a small one would run in high precision on a GPU under "auto").
    dense = jax_training.make_dense(impl, recipe, w.shape[0], small_shapes="quantize")
    variables = dense.init(jax.random.key(1), x)
    params = dict(variables["params"], kernel=w.T)
    variables = {**variables, "params": params}

    def fwd_bwd(variables, x, dy):
        y, vjp = jax.vjp(dense.apply, variables, x)
        return y, vjp(dy)

    with switched(variant):
        traced = jax.jit(fwd_bwd).trace(variables, x, dy)
        compiled = traced.lower().compile()
    kernels = str(traced.jaxpr).count(f"name={TRANSPOSED_KERNEL}")
    return (compiled, (variables, x, dy)), kernels


TRANSPOSED_KERNEL = "lowp_float8_cast_transposed"  # the Pallas kernel's name (_pallas_cast)


def fp8_gemms(compiled) -> int:
    """cuBLASLt fp8 GEMMs in a compiled step (0 off the GPU)."""
    return compiled.as_text().count(f'custom_call_target="{jax_training.FP8_GEMM}"')


def parts(recipe: str, x, w, dy) -> dict:
    """{part: (jitted fn, args)} of one recipe: casts, gemms, raw."""
    casts = jax.jit(lambda x, w, dy: lowp_jax.training_operands(x, w, dy, recipe))
    ops = casts(x, w, dy)
    present = {name: pair for name, pair in ops.items() if pair is not None}
    out_dtype = {"forward": x.dtype, "dgrad": x.dtype, "wgrad": w.dtype}

    def gemms(present):
        return {
            name: lowp_jax.dot_general(
                a,
                b,
                A_BT,
                lax.Precision.DEFAULT if name == "forward" else lax.Precision.HIGHEST,
                out_dtype[name],
            )
            for name, (a, b) in present.items()
        }

    codes = {name: (a.codes, b.codes) for name, (a, b) in present.items()}

    def raw(codes):
        return {
            name: lax.dot_general(a, b, A_BT, preferred_element_type=jnp.bfloat16)
            for name, (a, b) in codes.items()
        }

    return {
        "casts": (casts, (x, w, dy)),
        "gemms": (jax.jit(gemms), (present,)),
        "raw": (jax.jit(raw), (codes,)),
    }


def gemms_match_step(step, gemms) -> dict:
    """How the parts compute the step: {GEMM: (its output equals the step's y, dx or dw
    bit for bit, the SQNR in dB of one against the other)} (a GEMM the recipe runs in
    high precision is not among the parts). Off the GPU they are equal. On the H200 the
    tensorwise dgrad at 64x128x96 differed in 1 of 6 runs. The step and the gemms part are compiled
    apart, and XLA's autotuner times its candidate kernels, so the likely cause is that
    it picked another GEMM kernel for one of them (not confirmed from the failing
    run's HLO). Another accumulation order still gives the same product within spec
    §7's 40 dB; another computation does not."""
    (fn, args), (gemm_fn, gemm_args) = step, gemms
    y, (grads, dx) = fn(*args)
    step_out = {"forward": y, "dgrad": dx, "wgrad": grads["params"]["kernel"].T}
    result = {}
    for name, out in gemm_fn(*gemm_args).items():
        got, want = np.asarray(out, np.float64), np.asarray(step_out[name], np.float64)
        db = _gemm_conformance.sqnr_db(got, want)
        result[name] = (bool(np.array_equal(got, want)), round(db, 2))
    return result


def outputs_differ(step, reference) -> dict:
    """{output: (fraction of its elements that differ, largest difference over the
    reference's largest magnitude)} of two steps' y, dx and dw."""

    def outputs(call):
        fn, args = call
        y, (grads, dx) = fn(*args)
        return {"y": y, "dx": dx, "dw": grads["params"]["kernel"]}

    got, want = outputs(step), outputs(reference)
    result = {}
    for name, ref in want.items():
        a, b = got[name].astype(jnp.float32), ref.astype(jnp.float32)
        result[name] = (
            round(float(jnp.mean(a != b)), 6),
            float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))),
        )
    return result


def measure_shape(
    m, k, n, recipes, timing: _timing.Timing, variants=(), with_parts=True
) -> list[dict]:
    x, w, dy = shape_inputs(m, k, n)
    labels, calls, kernels = [], [], {}  # kernels: {index of a step: transposed casts}
    differ = {}  # {index of a variant step: outputs_differ from its recipe's step}

    def add_step(label, *args):
        labels.append(label)
        call, kernels[len(calls)] = step_call(*args)
        calls.append(call)

    for impl in ("bf16", "flax_fp8"):
        add_step((impl, impl, "step"), impl, None, x, w, dy)
    same = {}
    for recipe in recipes:
        add_step(("lowp", recipe, "step"), "lowp", recipe, x, w, dy)
        default = calls[-1]
        if with_parts:
            recipe_parts = parts(recipe, x, w, dy)
            same[recipe] = gemms_match_step(default, recipe_parts["gemms"])
            for part, call in recipe_parts.items():
                labels.append(("lowp", recipe, part))
                calls.append(call)
        for variant in variants:
            if recipe in VARIANTS[variant][1]:
                add_step(
                    ("lowp", step_label(recipe, variant), "step"), "lowp", recipe, x, w, dy, variant
                )
                differ[len(calls) - 1] = outputs_differ(calls[-1], default)
    results = {}

    def runner(fn, args):
        last = []

        def call():
            last[:] = [fn(*args)]

        return call, last

    runners = [runner(fn, args) for fn, args in calls]
    measured = _timing.time_interleaved(
        [r[0] for r in runners],
        lambda: [jax.block_until_ready(r[1]) for r in runners],
        timing,
    )
    rows = []
    for (impl, recipe, part), result in zip(labels, measured, strict=True):
        results[(impl, recipe, part)] = result.ms
        rows.append(
            {
                "M": m,
                "K": k,
                "N": n,
                "impl": impl,
                "recipe": recipe,
                "part": part,
                "ms": round(result.ms, 4),
                "iters": result.iters,
            }
        )
        if part == "step":
            rows[-1]["fp8_gemms_in_hlo"] = fp8_gemms(calls[len(rows) - 1][0])
            rows[-1]["transposed_cast_kernels"] = kernels[len(rows) - 1]
        if part == "step" and recipe in same:
            rows[-1]["gemms_match_step"] = same[recipe]
        if len(rows) - 1 in differ:
            rows[-1]["outputs_differ"] = differ[len(rows) - 1]
    bf16 = results[("bf16", "bf16", "step")]
    for row in rows:
        row["of_bf16_step"] = round(row["ms"] / bf16, 3)
    return rows


def device_events(trace: dict) -> dict:
    """{thread name: [(name, start us, duration us)]} of the complete events on the trace's
    device processes (`/device:...`; none on a CPU-only run)."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    devices = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and e["args"]["name"].startswith("/device:")
    }
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] in devices
    }
    found = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e["pid"] in devices:
            thread = threads.get((e["pid"], e["tid"]), str(e["tid"]))
            found[thread].append((e["name"], float(e["ts"]), float(e.get("dur", 0.0))))
    return dict(found)


def busy_us(spans) -> float:
    """The time covered by the union of (start, duration) spans."""
    total, end = 0.0, -float("inf")
    for start, dur in sorted(spans):
        if start + dur > end:
            total += start + dur - max(start, end)
            end = start + dur
    return total


def summarize_trace(by_thread: dict, steps: int, top: int = 30) -> dict:
    """A step's device time from `device_events`: per thread, its events' count, summed
    time, busy time (their union) and span (first start to last end), a step; and the
    `top` kernels by time a step, with their count a step."""
    threads, kernels = {}, collections.Counter()
    counts = collections.Counter()
    for thread, events in by_thread.items():
        spans = [(start, dur) for _, start, dur in events]
        threads[thread] = {
            "events": round(len(events) / steps, 2),
            "sum_us": round(sum(d for _, d in spans) / steps, 1),
            "busy_us": round(busy_us(spans) / steps, 1),
            "span_us": round((max(s + d for s, d in spans) - min(s for s, _ in spans)) / steps, 1),
        }
        for name, _, dur in events:
            kernels[(thread, name)] += dur
            counts[(thread, name)] += 1
    return {
        "threads": threads,
        "kernels": [
            {
                "thread": thread,
                "name": name[:160],
                "us": round(us / steps, 1),
                "count": round(counts[(thread, name)] / steps, 2),
            }
            for (thread, name), us in kernels.most_common(top)
        ],
    }


def trace_shape(m, k, n, recipes, variants=(), steps: int = 5) -> list[dict]:
    """The --trace rows of one shape: each step's `summarize_trace`, from `steps` calls
    run back to back under jax.profiler.trace after warming up (each recipe's step, and
    its step under each variant that changes it)."""
    x, w, dy = shape_inputs(m, k, n)
    rows = []
    labelled = [("bf16", None, None), ("flax_fp8", None, None)]
    for recipe in recipes:
        labelled.append(("lowp", recipe, None))
        labelled += [("lowp", recipe, v) for v in variants if recipe in VARIANTS[v][1]]
    for impl, recipe, variant in labelled:
        (fn, args), _ = step_call(impl, recipe, x, w, dy, variant)
        for _ in range(3):
            jax.block_until_ready(fn(*args))
        with tempfile.TemporaryDirectory() as log_dir:
            with jax.profiler.trace(log_dir, create_perfetto_trace=True):
                outs = [fn(*args) for _ in range(steps)]
                jax.block_until_ready(outs)
            (path,) = pathlib.Path(log_dir).rglob("perfetto_trace.json.gz")
            with gzip.open(path) as f:
                trace = json.load(f)
        summary = summarize_trace(device_events(trace), steps)
        label = step_label(recipe or impl, variant)
        rows.append({"M": m, "K": k, "N": n, "impl": impl, "recipe": label, **summary})
    return rows


def format_trace_rows(rows) -> str:
    lines = []
    for r in rows:
        lines.append(f"# {r['M']}x{r['K']}x{r['N']} {r['recipe']}: a step on the device")
        for thread, t in r["threads"].items():
            lines.append(
                f"  {thread[:40]:<40} {t['events']:7.1f} events {t['sum_us']:9.1f} us summed "
                f"{t['busy_us']:9.1f} busy {t['span_us']:9.1f} span"
            )
        for kern in r["kernels"][:15]:
            lines.append(f"    {kern['us']:9.1f} us x{kern['count']:<5} {kern['name'][:90]}")
    return "\n".join(lines)


def shape_inputs(m, k, n):
    """x (M, K), w (N, K) and dy (M, N) in bfloat16, the same for every part."""
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (m, k), jnp.bfloat16)
    w = (jax.random.normal(kw, (n, k), jnp.float32) * k**-0.5).astype(jnp.bfloat16)
    dy = jax.random.normal(kg, (m, n), jnp.bfloat16)
    return x, w, dy


def as_run_results(rows, meta: dict) -> dict:
    """The steps of `rows` (bf16, flax's, each recipe's; not the parts, not the variants)
    as a results file of bench/run.py's "jax" section, all timed side by side, which
    `run.py --from-results` merges into the targets summary."""
    # a variant's step is labelled "recipe (variant)" (`step_label`)
    steps = [r for r in rows if r["part"] == "step" and "(" not in r["recipe"]]
    out = []
    for row in steps:
        others = [r for r in steps if r is not row and (r["M"], r["K"]) == (row["M"], row["K"])]
        out.append(
            {
                **{key: row[key] for key in ("M", "K", "N", "impl", "recipe", "ms", "iters")},
                "fp8_gemms_in_hlo": row["fp8_gemms_in_hlo"],
                "timed_with": [
                    r["impl"] if r["impl"] != "lowp" else f"lowp {r['recipe']}" for r in others
                ],
            }
        )
    note = (
        "bench/probes/jax_step_parts.py: the steps of bf16, flax's fp8 and each recipe, interleaved"
    )
    section = {"rows": out, "skipped": [], "errors": [], "notes": [note], "seconds": 0.0}
    return {"meta": meta, "sections": {"jax": section}}


def format_rows(rows) -> str:
    lines = []
    for r in rows:
        label = r["impl"] if r["impl"] != "lowp" else r["recipe"]
        lines.append(
            f"{r['M']}x{r['K']}x{r['N']:<6} {label:>22} {r['part']:>6}: {r['ms']:8.4f} ms "
            f"({r['of_bf16_step']:.3f} of the bf16 step)"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--variants",
        default="",
        help=f"comma list of {sorted(VARIANTS)}: each recipe's step is also timed with "
        "each variant that changes it",
    )
    parser.add_argument("--out", help="JSON rows here, rewritten after each shape")
    parser.add_argument(
        "--run-out", help="also the steps as a bench/run.py results file (`as_run_results`)"
    )
    parser.add_argument("--trace", action="store_true", help="device traces, no timing")
    parser.add_argument(
        "--no-parts", action="store_true", help="time the steps only (fewer compiles)"
    )
    args = parser.parse_args(argv)
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: {unknown} not among {sorted(VARIANTS)}")
    timing = _timing.Timing(warmup=3, repeats=args.repeats, target_s=0.05)
    rows = []
    for shape in args.shapes.split(","):
        m, k, n = (int(v) for v in shape.split("x"))
        if args.trace:
            shape_rows = trace_shape(m, k, n, args.recipes.split(","), variants)
            print(format_trace_rows(shape_rows), flush=True)
            rows += shape_rows
            if args.out:
                pathlib.Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
            continue
        shape_rows = measure_shape(
            m, k, n, args.recipes.split(","), timing, variants, not args.no_parts
        )
        print(format_rows(shape_rows), flush=True)
        for row in shape_rows:
            if "gemms_match_step" in row:
                print(
                    f"{row['recipe']}: the gemms part against the step's outputs "
                    "(bit for bit, SQNR dB): "
                    f"{row['gemms_match_step']}",
                    flush=True,
                )
            if "outputs_differ" in row:
                print(f"{row['recipe']}: against the default step {row['outputs_differ']}")
        rows += shape_rows
        meta = {"jax": jax.__version__, "device": jax.devices()[0].device_kind}
        if args.out:  # after each shape: a run cut short keeps what it measured
            pathlib.Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        if args.run_out:
            results = as_run_results(rows, meta)
            pathlib.Path(args.run_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
