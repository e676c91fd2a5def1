"""lowp's benchmarks in one process on one GPU: a table, a results file, the summary.

    python bench/run.py                                   # everything, H200 sizes
    python bench/run.py --sections linear,sweep --time-budget 500
    python bench/run.py --summary bench/results/h200.json # also the issue-7 summary
    python bench/run.py --from-results A.json B.json --summary bench/results/h200.json
    python bench/run.py --small                           # CPU smoke run, tiny shapes

Sections (each can be picked with --sections; a failing item is recorded and the run
goes on; with --time-budget, items that no longer fit are skipped and recorded):

  casts   bf16 -> fp8 casts at 16384^2 as a fraction of a same-run device copy, run by
          bench/casts.py (its fused Triton path is the number in the summary).
  gemm    a quantized Linear's forward per inference preset vs bf16 (bench/torch_linear.py).
  linear  one Linear's forward + backward per training recipe vs bf16 eager and bf16
          compiled, lowp eager and compiled, torchao's recipe compiled and eager (when
          torchao imports), and the limit: the recipe's three GEMMs alone on
          pre-quantized operands (bench/gemm_limit.py). LLM shapes of ANCHORS.md.
  jax     the same in JAX: flax Dense with lowp's training dot vs bf16 and vs flax's
          Fp8DirectDotGeneralOp (delayed scaling) (bench/jax_training.py).
  sweep   the small-shape sweep: M = 16 ... 16384 at K = N = 4096 and 8192, every
          float8 recipe vs bf16, forward + backward, beside a second bf16 layer whose
          ratio to the first is the timing noise at that shape.
  memory  peak CUDA memory of an eager transformer-block training step per recipe.
  block   that block's training step timed, bf16 vs each float8 recipe, eager and
          compiled (bench/torch_block.py), with its peak memory.
  model_train  a Llama-3-8B-shaped model slice (attention projections + SwiGLU FFN, two
          layers) trained at T = 2048 ... 16384 tokens: bf16, lowp's convert_to_training
          with its defaults, torchao's float8 training, eager and compiled, every variant
          of a T timed interleaved (bench/model.py).
  model_infer  that slice's forward under inference_mode at T = 1 ... 8192: bf16, lowp's
          quantize_ presets with their defaults, torchao's float8 inference configs.
  jax_model_train, jax_model_infer  the same slice in flax linen, jitted: bf16, lowp's
          training dot / quantized kernels with their defaults, flax's fp8 dot
          (bench/jax_model.py).
  cpu_model  a Hugging Face transformers BERT (all-MiniLM-L6-v2) forward on the CPU,
          float32 vs each inference preset (bench/cpu_model.py). Runs on the CPU
          whatever --device says, and only when asked for by name.
  cpu_resources  quantizing on the CPU: the NumPy reference's and lowp_torch's peak RSS
          and time per scheme at 8192^2 float32 and bf16, against ml_dtypes' and torch's
          plain casts (bench/cpu_resources.py).

MX recipes have no MX GEMM before sm_100: on Hopper (and CPU) their GEMMs are
emulated, and their rows say "numerics only". Results: bench/results/run_<device>_<time>.json
holds every row, skip and error, rewritten after each row; --summary PATH writes the
targets summary (bench/summary.py), also as the run goes.

A full H200 run takes longer than one 10-minute GPU call: split it by section (every
ratio compares rows of one section, so each stays within one run) and merge:

    python bench/run.py --sections linear --time-budget 500 --out A.json
    python bench/run.py --sections casts,jax,sweep,memory,gemm,block --time-budget 500 --out B.json
    python bench/run.py --from-results A.json B.json --summary bench/results/h200.json

--small runs tiny shapes with few iterations, eager only unless --modes says otherwise,
and torch.compile on the "aot_eager" backend (Inductor's C++ build would take minutes
on a CPU): it checks the plumbing, not the speed.
"""

import os

# torch and JAX share the one GPU: JAX must not take 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import io
import json
import pathlib
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp
from bench import (
    _record,
    _timing,
    cpu_model,
    gemm_limit,
    linear_step,
    model,
    summary,
    torch_block,
    torch_linear,
)
from bench import moe as moe_bench

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SECTIONS = (
    "casts",
    "linear",
    "jax",
    "sweep",
    "memory",
    "block",
    "gemm",
    "model_train",
    "model_infer",
    "jax_model_train",
    "jax_model_infer",
    "moe",
    "cpu_model",
    "cpu_resources",
)
CPU_SECTIONS = ("cpu_model", "cpu_resources")  # run only when named: they measure the CPU
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in CPU_SECTIONS)  # the GPU run


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes each section runs: the H200's (`FULL`) or a CPU smoke run's (`SMALL`)."""

    linear: tuple  # (M, K, N) of the linear and jax sections
    sweep_m: tuple
    sweep_kn: tuple  # K = N
    block: torch_block.BlockShape
    gemm: dict  # torch_linear's named shapes
    model: model.Shape
    train_tokens: tuple
    infer_tokens: tuple
    cast_shape: str
    cast_iters: int
    timing: _timing.Timing
    sweep_timing: _timing.Timing  # more, shorter repeats: launch-bound steps are noisy
    moe: tuple  # bench/moe.py's MoEShapes
    cpu_batch: int  # cpu_model's sentences
    cpu_timing: _timing.Timing
    cpu_shape: str = "8192x8192"  # cpu_resources: the NumPy reference's input
    cpu_repeats: int = 3


FULL = Sizes(
    linear=((16384, 4096, 14336), (16384, 8192, 8192)),
    sweep_m=(16, 64, 256, 1024, 4096, 16384),
    sweep_kn=(4096, 8192),
    # Llama-3-8B's layer: 8192 tokens
    block=torch_block.BlockShape(dim=4096, heads=32, ffn=14336, batch=2, seq=4096),
    gemm=torch_linear.SHAPES,
    model=model.LLAMA3_8B,
    train_tokens=model.TRAIN_TOKENS,
    infer_tokens=model.INFER_TOKENS,
    cast_shape="16384x16384",
    cast_iters=10,
    timing=_timing.Timing(warmup=3, repeats=5, target_s=0.05),
    sweep_timing=_timing.Timing(warmup=3, repeats=11, target_s=0.03),
    moe=moe_bench.FULL,
    cpu_batch=8,
    cpu_timing=_timing.Timing(warmup=1, repeats=5, target_s=0.3),
)
SMALL = Sizes(
    linear=((64, 128, 256),),
    sweep_m=(16, 64),
    sweep_kn=(128,),
    block=torch_block.BlockShape(dim=64, heads=2, ffn=128, batch=2, seq=32),
    gemm={"large": (64, 128, 128)},
    model=model.TINY,
    train_tokens=(32,),
    infer_tokens=(1, 16),
    cast_shape="64x256",
    cast_iters=1,
    timing=_timing.Timing(warmup=1, repeats=1, target_s=0.0),
    sweep_timing=_timing.Timing(warmup=1, repeats=1, target_s=0.0),
    moe=moe_bench.SMALL,
    cpu_batch=2,
    cpu_timing=_timing.Timing(warmup=1, repeats=1, target_s=0.0),
    cpu_shape="64x256",
    cpu_repeats=1,
)


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    sizes: Sizes
    device: torch.device
    recipes: tuple
    backend: str

    def modes(self, flag: str) -> list:
        return [m for m in getattr(self.args, flag).split(",") if m]

    def float8_recipes(self) -> list:
        return [r for r in self.recipes if r in summary.FLOAT8_RECIPES]

    def by_priority(self) -> list:
        """[(True, float8 recipes), (False, the others)], the flag saying whether a pass
        measures the baselines: every shape's baselines and float8 rows come before any
        MX row, so a time budget that runs out drops the MX recipes (emulated on
        Hopper) first."""
        others = [r for r in self.recipes if r not in summary.FLOAT8_RECIPES]
        return [(True, self.float8_recipes()), (False, others)]


# --- the sections: each adds items to its `_record.Section` ---


def casts(ctx: Context, sec: _record.Section) -> None:
    """bench/casts.py (it belongs with the fused cast kernels), run through its own CLI."""
    from bench import casts as cast_bench

    paths = ctx.args.cast_paths
    if ctx.device.type != "cuda" and "triton" in paths.split(","):
        # Off CUDA the Triton kernels run only under TRITON_INTERPRET=1.
        paths = ",".join(p for p in paths.split(",") if p != "triton") or "eager"
        sec.note("no Triton path off CUDA: the summary's cast fractions are null")

    def measure():
        # Its own printout would repeat the rows this section prints.
        with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
            argv = ["--device", str(ctx.device), "--shape", ctx.sizes.cast_shape]
            argv += ["--iters", str(ctx.sizes.cast_iters), "--paths", paths]
            argv += ["--out", str(pathlib.Path(tmp) / "casts.json")]
            result = cast_bench.main(argv)
        sec.note(f"copy: {result['copy']}")
        return result["rows"]

    sec.item(f"casts {ctx.sizes.cast_shape} paths={paths}", measure)


def gemm(ctx: Context, sec: _record.Section) -> None:
    plan = torch_linear.items(
        ctx.sizes.gemm,
        lowp.InferenceConfig.names(),
        [{"compiled": "compile"}.get(m, m) for m in ctx.modes("gemm_modes")],
        ctx.device,
        ctx.sizes.timing,
        kernel="auto",
        fast_accum=True,
        backend=ctx.backend,
    )
    for what, measure in plan:
        sec.item(what, measure)


def linear(ctx: Context, sec: _record.Section) -> None:
    torchao_why = linear_step.torchao_problem()
    if torchao_why:
        sec.note(f"no torchao rows: {torchao_why}")
    modes = ctx.modes("modes")
    for with_baselines, recipes in ctx.by_priority():
        for m, k, n in ctx.sizes.linear:
            tensors = linear_step.inputs(m, k, n, ctx.device)
            shape = f"{m}x{k}x{n}"
            for mode in modes if with_baselines else ():
                _linear_item(ctx, sec, "bf16", None, mode, tensors, shape)
            for recipe in recipes:
                for mode in modes:
                    _linear_item(ctx, sec, "lowp", recipe, mode, tensors, shape)
                if recipe in linear_step.TORCHAO_RECIPE and not torchao_why:
                    for mode in reversed(modes):  # compiled first: the number the targets compare
                        _linear_item(ctx, sec, "torchao", recipe, mode, tensors, shape)
                sec.item(
                    f"{shape} limit {recipe}",
                    lambda recipe=recipe, tensors=tensors: [
                        gemm_limit.measure(recipe, tensors, ctx.sizes.timing)
                    ],
                )
            del tensors
            linear_step.release(ctx.device)


def _linear_item(ctx, sec, impl, recipe, mode, tensors, shape) -> None:
    def measure():
        try:
            return [linear_step.measure(impl, recipe, mode, tensors, ctx.sizes.timing, ctx.backend)]
        finally:
            linear_step.release(ctx.device)

    sec.item(f"{shape} {impl} {recipe or ''} {mode}", measure)


def sweep(ctx: Context, sec: _record.Section) -> None:
    """One item per shape and mode: bf16, a second bf16 layer (the control) and every
    float8 recipe timed side by side (`linear_step.measure_interleaved`), with the same
    iteration count. At small M a step is launch-bound, ~0.2 ms: timed one after
    another the variants drifted apart by up to 40% on the H200 even where the
    small-shape policy ran them as the same `F.linear`, and interleaved, still by up
    to 17% (2026-11-30). The control's ratio to bf16 is that noise, measured."""
    modes = ctx.modes("sweep_modes")
    variants = [("bf16", None), ("bf16_control", None)]
    variants += [("lowp", r) for r in ctx.float8_recipes()]
    for kn in ctx.sizes.sweep_kn:
        for m in ctx.sizes.sweep_m:
            tensors = linear_step.inputs(m, kn, kn, ctx.device)
            shape = f"{m}x{kn}x{kn}"
            for mode in modes:

                def measure(mode=mode, tensors=tensors, shape=shape):
                    def failed(variant, error):
                        impl, recipe = variant
                        sec.fail(f"{shape} {impl} {recipe or ''} {mode}", error)

                    try:
                        return linear_step.measure_interleaved(
                            variants,
                            mode,
                            tensors,
                            ctx.sizes.sweep_timing,
                            ctx.backend,
                            failed,
                            same_iters=True,
                        )
                    finally:
                        linear_step.release(ctx.device)

                sec.item(f"{shape} {mode}: bf16 and every float8 recipe", measure)


def memory(ctx: Context, sec: _record.Section) -> None:
    if ctx.device.type != "cuda":
        sec.note("peak memory is read from torch.cuda: null off CUDA")
    for recipe in ("bf16", *ctx.recipes):
        sec.item(f"memory {recipe}", lambda recipe=recipe: [_block_row(ctx, recipe, "eager", None)])


def block(ctx: Context, sec: _record.Section) -> None:
    for mode in ctx.modes("modes"):
        for recipe in ("bf16", *ctx.float8_recipes()):
            sec.item(
                f"block {recipe} {mode}",
                lambda recipe=recipe, mode=mode: [_block_row(ctx, recipe, mode, ctx.sizes.timing)],
            )


def _block_row(ctx, recipe, mode, timing) -> dict:
    try:
        return torch_block.measure(recipe, mode, ctx.sizes.block, ctx.device, timing, ctx.backend)
    finally:
        linear_step.release(ctx.device)


def cpu_model_section(ctx: Context, sec: _record.Section) -> None:
    presets = lowp.InferenceConfig.names()
    sec.note("on the CPU every GEMM is emulated: dequantize, float32 matmul (spec §7)")
    sec.item(
        "transformers BERT: float32 and every inference preset",
        lambda: cpu_model.measure(presets, ctx.sizes.cpu_batch, ctx.sizes.cpu_timing),
    )


def jax_section(ctx: Context, sec: _record.Section) -> None:
    """torch gives its cached GPU memory back first (`release`): JAX allocates its own."""
    linear_step.release(ctx.device)
    import jax

    from bench import jax_training

    sec.note(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    for with_baselines, recipes in ctx.by_priority():
        for m, k, n in ctx.sizes.linear:
            tensors = jax_training.inputs(m, k, n)
            shape = f"{m}x{k}x{n}"
            if with_baselines:  # bf16, flax's fp8 and the float8 recipes side by side

                def failed(variant, error, shape=shape):
                    impl, recipe = variant
                    sec.fail(f"{shape} {impl} {recipe or ''}", error)

                variants = [("bf16", None), ("flax_fp8", None)] + [("lowp", r) for r in recipes]
                sec.item(
                    f"{shape} bf16, flax_fp8 and the float8 recipes",
                    lambda variants=variants, tensors=tensors, failed=failed: (
                        jax_training.measure_interleaved(
                            variants, tensors, ctx.sizes.timing, failed
                        )
                    ),
                )
                continue
            for recipe in recipes:  # MX: emulated on Hopper, each an item a time budget may drop
                sec.item(
                    f"{m}x{k}x{n} lowp {recipe}",
                    lambda recipe=recipe, tensors=tensors: [
                        jax_training.measure("lowp", recipe, tensors, ctx.sizes.timing)
                    ],
                )


def model_train(ctx: Context, sec: _record.Section) -> None:
    _model_rows(ctx, sec, "train", ctx.sizes.train_tokens)


def model_infer(ctx: Context, sec: _record.Section) -> None:
    _model_rows(ctx, sec, "infer", ctx.sizes.infer_tokens)


def _model_rows(ctx: Context, sec: _record.Section, task: str, tokens: tuple) -> None:
    """One item per T: every variant and mode of bench/model.py timed interleaved."""
    if ctx.device.type == "cuda" and model.torchao_problem():
        sec.note(f"no torchao rows: {model.torchao_problem()}")
    modes = [{"compile": "compiled"}.get(m, m) for m in ctx.modes("modes")]
    for t in tokens:

        def measure(t=t):
            def failed(label, error):
                sec.fail(f"{task} T={t} {label[0]} {label[1]}", error)

            try:
                return model.measure(
                    task,
                    t,
                    ctx.sizes.model,
                    ctx.device,
                    ctx.sizes.timing,
                    modes,
                    ctx.backend,
                    failed,
                    ctx.modes("variants"),
                )
            finally:
                linear_step.release(ctx.device)

        sec.item(f"{task} T={t}: every variant", measure)


def jax_model_train(ctx: Context, sec: _record.Section) -> None:
    _jax_model_rows(ctx, sec, "train", ctx.sizes.train_tokens)


def jax_model_infer(ctx: Context, sec: _record.Section) -> None:
    _jax_model_rows(ctx, sec, "infer", ctx.sizes.infer_tokens)


def _jax_model_rows(ctx: Context, sec: _record.Section, task: str, tokens: tuple) -> None:
    linear_step.release(ctx.device)  # JAX allocates its own memory
    from bench import jax_model

    for t in tokens:

        def measure(t=t):
            def failed(variant, error):
                sec.fail(f"jax {task} T={t} {variant}", error)

            return jax_model.measure(task, t, ctx.sizes.model, ctx.sizes.timing, failed)

        sec.item(f"jax {task} T={t}: every variant", measure)


def moe(ctx: Context, sec: _record.Section) -> None:
    """bench/moe.py: the experts of an MoE layer, bf16 against lowp's float8 recipes and
    torchao's prototype side by side, per shape, routing and mode; then JAX."""
    torchao_why = moe_bench.torchao_problem(ctx.device)
    if torchao_why:
        sec.note(f"no torchao rows: {torchao_why}")
    named = ctx.args.recipes != ",".join(lowp.Recipe.names())
    recipes, skipped = moe_bench.recipes_to_time(ctx.float8_recipes(), ctx.device, named)
    for recipe, why in skipped:
        sec.note(f"no lowp {recipe} rows (name it with --recipes to time it): {why}")
    variants = [("bf16", None)] + [("lowp", r) for r in recipes]
    variants += [] if torchao_why else [("torchao", "float8_rowwise")]
    for shape in ctx.sizes.moe:
        for routing in moe_bench.ROUTINGS:
            for mode in ctx.modes("modes"):

                def measure(shape=shape, routing=routing, mode=mode):
                    def failed(variant, error):
                        sec.fail(f"moe {shape.key} {routing} {variant[0]} {mode}", error)

                    try:
                        return moe_bench.measure_interleaved(
                            shape,
                            routing,
                            mode,
                            variants,
                            ctx.device,
                            ctx.sizes.timing,
                            ctx.backend,
                            failed,
                        )
                    finally:
                        linear_step.release(ctx.device)

                sec.item(f"moe {shape.key} {routing} {mode}", measure)
    if importlib.util.find_spec("jax") is None:
        sec.note("no JAX rows: jax is not installed")
        return
    for shape in ctx.sizes.moe:
        for routing in moe_bench.ROUTINGS:
            sec.item(
                f"moe jax {shape.key} {routing}",
                lambda shape=shape, routing=routing: moe_bench.jax_measure(
                    shape, routing, ctx.float8_recipes() if named else [], ctx.sizes.timing
                ),
            )


def cpu_resources(ctx: Context, sec: _record.Section) -> None:
    """bench/cpu_resources.py: lowp.quantize's and lowp_torch.quantize's peak memory and
    time on the CPU against the plain casts, per scheme and input dtype, each measured in
    a child process."""
    from bench import cpu_resources as cpu

    casts: dict = {}
    for path in cpu.PATHS:
        for hp_dtype in cpu.DTYPES:
            for scheme in cpu.SCHEMES:
                sec.item(
                    f"{path} {scheme} {hp_dtype}",
                    lambda scheme=scheme, hp_dtype=hp_dtype, path=path: [
                        cpu.measure(
                            scheme,
                            hp_dtype,
                            ctx.sizes.cpu_shape,
                            ctx.sizes.cpu_repeats,
                            casts,
                            path,
                        )
                    ],
                )


def _cpu_format(row) -> str:
    from bench import cpu_resources

    return cpu_resources.format_row(row)


def _format_cast(row) -> str:
    return (
        f"{row['scheme']:>16} {row['path']:>8}: {row['ms']:9.4f} ms {row['gb_per_s']:8.1f} GB/s "
        f"{row['fraction_of_copy']:6.3f} of copy [{row['bytes_check']}]"
    )


def _jax_format(row) -> str:
    from bench import jax_training

    return jax_training.format_row(row)


RUNNERS = {
    "casts": (casts, _format_cast),
    "gemm": (gemm, torch_linear.format_row),
    "linear": (linear, linear_step.format_row),
    "jax": (jax_section, _jax_format),
    "sweep": (sweep, linear_step.format_row),
    "memory": (memory, torch_block.format_row),
    "block": (block, torch_block.format_row),
    "model_train": (model_train, model.format_row),
    "model_infer": (model_infer, model.format_row),
    "jax_model_train": (jax_model_train, model.format_row),
    "jax_model_infer": (jax_model_infer, model.format_row),
    "moe": (moe, moe_bench.format_row),
    "cpu_model": (cpu_model_section, cpu_model.format_row),
    "cpu_resources": (cpu_resources, _cpu_format),
}


# --- the run ---


def describe(device) -> dict:
    """What the numbers were measured on."""
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "capability": list(torch.cuda.get_device_capability(device))
        if device.type == "cuda"
        else None,
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }
    for name in ("triton", "jax", "flax", "torchao"):
        spec = importlib.util.find_spec(name)
        info[name] = None if spec is None else _version(name)
    return info


def _version(name: str):
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def _git(*args) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def run(args) -> dict:
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    if args.small and device.type == "cpu":
        # Two OpenMP threads on a busy 2-core machine run tiny ops many times slower.
        torch.set_num_threads(1)
    try:
        return _run(args, device)
    finally:
        torch.set_num_threads(threads)  # a caller in the same process (a test) keeps its own


def _run(args, device) -> dict:
    sizes = SMALL if args.small else FULL
    if args.tokens:  # the model sections at these token counts only
        tokens = tuple(int(t) for t in args.tokens.split(","))
        sizes = dataclasses.replace(sizes, train_tokens=tokens, infer_tokens=tokens)
    recipes = tuple(r for r in args.recipes.split(",") if r)
    for recipe in recipes:
        lowp.Recipe.from_name(recipe)  # a typo fails now, not an hour in
    ctx = Context(args, sizes, device, recipes, args.compile_backend)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = pathlib.Path(args.out or RESULTS / f"run_{device.type}_{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    budget = _timing.Budget(args.time_budget)
    result = {"meta": describe(device), "args": vars(args), "sections": {}, "summary": None}
    sections = {}

    def save():
        result["sections"] = {name: s.as_dict() for name, s in sections.items()}
        result["summary"] = summary.build(result["sections"])
        _write(out, result)
        if args.summary:
            _write(pathlib.Path(args.summary), result["summary"])

    for name in args.sections.split(","):
        runner, format_row = RUNNERS[name]
        sec = sections[name] = _record.Section(name, budget, save, format_row)
        print(f"=== {name} ({budget.left():.0f} s of budget left)", flush=True)
        try:
            runner(ctx, sec)
        except Exception as e:  # noqa: BLE001 - a section that cannot start is a result too
            sec.fail(f"section {name}", e)
        save()
    print()
    print(summary.format_table(result["summary"]))
    print(f"wrote {out}" + (f" and {args.summary}" if args.summary else ""))
    return result


# What names a row in each section: a row of the same name in a later file replaces it.
_ROW_IDENTITY = {
    "casts": ("scheme", "path"),
    "gemm": ("M", "K", "N", "preset", "mode"),
    "linear": ("M", "K", "N", "impl", "recipe", "mode"),
    "jax": ("M", "K", "N", "impl", "recipe"),
    "sweep": ("M", "K", "N", "impl", "recipe", "mode"),
    "memory": ("recipe", "mode"),
    "block": ("recipe", "mode"),
    "moe": ("shape", "routing", "impl", "recipe", "mode"),
    "model_train": ("framework", "task", "T", "variant", "mode"),
    "model_infer": ("framework", "task", "T", "variant", "mode"),
    "jax_model_train": ("framework", "task", "T", "variant", "mode"),
    "jax_model_infer": ("framework", "task", "T", "variant", "mode"),
    "cpu_model": ("model", "preset", "batch"),
    "cpu_resources": ("scheme", "hp_dtype", "shape"),
}


def merge(paths) -> dict:
    """Several runs' results files as one, for a run split over GPU calls. Every ratio
    compares rows of one run: the summary is each file's own, merged value by value,
    the later file's winning where both measured it (a recipe re-measured at a shape
    replaces only its own ratios there, each over the bf16 of its own run). The rows:
    skips and errors are concatenated; a row measured in two files counts as the later,
    and in a section of shapes (its rows keyed by M, K, N) a shape measured again is
    the later file's alone."""
    merged: dict = {"meta": [], "sections": {}, "summary": {}}
    for path in paths:
        one = json.loads(pathlib.Path(path).read_text())
        merged["meta"].append(one["meta"])
        _merge_summary(merged["summary"], summary.build(one["sections"]))
        for name, sec in one["sections"].items():
            into = merged["sections"].setdefault(
                name, {"rows": [], "skipped": [], "errors": [], "notes": [], "seconds": 0.0}
            )
            identity = _ROW_IDENTITY[name]
            if identity[:3] == ("M", "K", "N"):
                identity = identity[:3]  # a shape measured again replaces all its rows
            names = {tuple(row.get(k) for k in identity) for row in sec["rows"]}
            into["rows"] = [
                row for row in into["rows"] if tuple(row.get(k) for k in identity) not in names
            ] + sec["rows"]
            for key in ("skipped", "errors", "notes"):
                into[key] += sec[key]
            into["seconds"] += sec["seconds"]
    return merged


def _merge_summary(into: dict, later: dict, top: bool = True) -> dict:
    """`later`'s values over `into`'s, leaf by leaf; the recipes of "numerics_only" are
    united, and a value a run did not measure (None, empty) replaces nothing."""
    for key, value in later.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge_summary(into[key], value, top=False)
        elif top and key == "numerics_only" and key in into:
            into[key] = sorted(set(into[key]) | set(value))
        elif value not in (None, {}, []) or key not in into:
            into[key] = value
    return into


def _write(path: pathlib.Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sections", default=",".join(DEFAULT_SECTIONS), help="comma list, run in order"
    )
    parser.add_argument("--small", action="store_true", help="tiny shapes: a CPU smoke run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--recipes", default=",".join(lowp.Recipe.names()), help="comma list")
    parser.add_argument(
        "--modes",
        default=None,
        help="linear, block and the model sections: eager,compiled; the torch model sections also cudagraphs (compiled with mode=reduce-overhead)",
    )
    parser.add_argument("--sweep-modes", default="eager", help="sweep: eager,compiled")
    parser.add_argument("--gemm-modes", default="eager", help="gemm: eager,compiled")
    parser.add_argument(
        "--cast-paths", default=None, help="bench/casts.py's paths (--small: eager only)"
    )
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend (inductor; --small: aot_eager)",
    )
    parser.add_argument(
        "--variants",
        default="",
        help="the torch model sections: these variants only (comma list, e.g. bf16,lowp_float8_rowwise)",
    )
    parser.add_argument(
        "--tokens", default="", help="model sections: these token counts (comma list)"
    )
    parser.add_argument("--time-budget", type=float, default=None, help="seconds for the run")
    parser.add_argument("--out", default="", help="results file (default: bench/results/run_*)")
    parser.add_argument("--summary", default="", help="also write the targets summary here")
    parser.add_argument(
        "--from-results",
        nargs="+",
        default=None,
        metavar="FILE",
        help="measure nothing: summarise these results files (with --summary, write it)",
    )
    args = parser.parse_args(argv)
    if args.modes is None:
        args.modes = "eager" if args.small else "eager,compiled"
    if args.cast_paths is None:
        args.cast_paths = "eager" if args.small else "triton,eager,compile"
    if args.compile_backend is None:
        args.compile_backend = "aot_eager" if args.small else "inductor"
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    modes = set(args.modes.split(","))
    others = set(args.sections.split(",")) & {"linear", "block", "moe"}
    if "cudagraphs" in modes and (others or args.compile_backend != "inductor"):
        parser.error(
            "--modes cudagraphs is a mode of the torch model sections, compiled by Inductor; "
            f"got it with sections {sorted(others)} and --compile-backend {args.compile_backend}"
        )
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.from_results:
        result = merge(args.from_results)
        print(summary.format_table(result["summary"]))
        if args.summary:
            _write(pathlib.Path(args.summary), result["summary"])
            print(f"wrote {args.summary}")
        return result
    return run(args)


if __name__ == "__main__":
    main()
