"""One linear layer's forward + backward in PyTorch: bf16, a lowp recipe, torchao's recipe.

Every variant starts from the same bf16 weight (N, K) and runs `layer(x).backward(dy)`
on the same x (M, K), which requires grad so the dgrad GEMM runs, and the same random
cotangent dy (M, N): with a `y.sum()` loss the compiler may turn the backward GEMMs
into reductions. Gradients are reset to None before each call, so no variant pays for
accumulating into an old one. "compiled" is `torch.compile` of the module, forward
and backward (AOTAutograd), with static shapes.

Used by the "linear" section (the LLM shapes) and the "sweep" section (small M).
"""

import gc
import importlib.util

import torch
from torch import nn

import lowp_torch
from bench import _timing, _torch_log

# lowp's recipe -> torchao.float8's recipe name, for the recipes torchao has on Hopper
# (its MX training needs sm_100).
TORCHAO_RECIPE = {
    "float8_tensorwise": "tensorwise",
    "float8_rowwise": "rowwise",
    "float8_rowwise_gw_hp": "rowwise_with_gw_hp",
}
MODES = ("eager", "compiled")


def torchao_problem() -> str | None:
    """Why torchao's float8 training cannot be measured here, or None."""
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed"
    try:
        import torchao.float8  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken install is a reason, not a crash
        return f"torchao.float8 does not import: {type(e).__name__}: {e}"
    return None


def inputs(m: int, k: int, n: int, device) -> tuple:
    """x (M, K), weight (N, K) and dy (M, N) in bfloat16, the same for every variant."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, torch.bfloat16)

    return randn(m, k), randn(n, k, scale=k**-0.5), randn(m, n)


def make_layer(impl: str, recipe: str | None, weight: torch.Tensor) -> nn.Module:
    """A bias-free linear holding a copy of `weight`: plain bf16 ("bf16", and
    "bf16_control", a second one whose time against the first shows a run's timing
    noise), converted by lowp_torch.convert_to_training ("lowp") or by torchao's
    convert_to_float8_training with the matching recipe ("torchao")."""
    n, k = weight.shape
    layer = nn.Linear(k, n, bias=False, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    if impl in ("bf16", "bf16_control"):
        return layer
    elif impl == "lowp":
        return lowp_torch.convert_to_training(layer, recipe)
    elif impl == "torchao":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        model = nn.Sequential(layer)  # torchao swaps children
        config = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPE[recipe])
        return convert_to_float8_training(model, config=config)
    raise ValueError(f"unknown linear impl {impl!r}")


def fwd_bwd(module: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """The timed call: forward and backward, gradients reset first."""
    x = x.detach().requires_grad_(True)
    params = list(module.parameters())

    def call():
        x.grad = None
        for p in params:
            p.grad = None
        module(x).backward(dy)

    return call


def measure(impl, recipe, mode, tensors, timing: _timing.Timing, backend: str) -> dict:
    """One row: the median time of `fwd_bwd` for this variant and mode."""
    return measure_interleaved([(impl, recipe)], mode, tensors, timing, backend)[0]


def measure_interleaved(
    variants,
    mode,
    tensors,
    timing: _timing.Timing,
    backend: str,
    on_error=None,
    same_iters: bool = False,
) -> list[dict]:
    """One row per (impl, recipe) variant, timed side by side (`_timing.time_interleaved`,
    with its `same_iters`).

    on_error(variant, exception): called for a variant whose layer fails to build or
    run, which then has no row while the others are timed; without it, the exception
    propagates."""
    x, weight, dy = tensors
    (m, k), n = x.shape, weight.shape[0]

    def build(variant):
        impl, recipe = variant
        layer = make_layer(impl, recipe, weight)
        # one eager call tells which kernels run (also when compiled)
        decided = _torch_log.lowp_decisions(fwd_bwd(layer, x, dy)) if impl == "lowp" else None
        if mode == "compiled":
            layer = torch.compile(layer, backend=backend, dynamic=False)
        call = fwd_bwd(layer, x, dy)
        call()  # a failure to compile belongs to this variant
        return call, decided

    kept, built = _timing.build_each(variants, build, on_error)
    calls = [call for call, _ in built]
    decisions = [decided for _, decided in built]
    measured = _timing.time_interleaved(calls, _timing.torch_sync(x.device), timing, same_iters)
    rows = []
    for (impl, recipe), result, decided in zip(kept, measured, decisions, strict=True):
        row = {
            "M": m,
            "K": k,
            "N": n,
            "impl": impl,
            "recipe": recipe or "bf16",
            "mode": mode,
            "ms": round(result.ms, 4),
            "tflops": round(6 * m * k * n / (result.ms * 1e-3) / 1e12, 2),
            "warmup_s": round(result.warmup_s, 2),
            "iters": result.iters,
        }
        if len(kept) > 1:
            row["timed_with"] = [f"{i} {r or 'bf16'}" for i, r in kept if (i, r) != (impl, recipe)]
        if decided is not None:
            row.update(decided)
            # No fp8 kernel for a GEMM (MX before sm_100, or CPU): the time is of emulation.
            row["numerics_only"] = "emulated" in decided["gemms"]
        rows.append(row)
    return rows


def release(device) -> None:
    """Forget compiled graphs and free cached memory between items, so one item's
    recompilations and allocations do not bend the next one's numbers."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def format_row(row: dict) -> str:
    shape = f"{row['M']}x{row['K']}x{row['N']}"
    label = {
        "bf16": "bf16",
        "bf16_control": "bf16 (control)",
        "limit": f"limit {row['recipe']}",
    }.get(row["impl"], f"{row['impl']} {row['recipe']}")
    head = f"{shape:>18} {label:>30} {row['mode']:>8}: "
    if row["ms"] is None:
        return head + f"not measured: {row.get('why')}"
    extra = ""
    if "gemms" in row:
        extra = f"  gemms={','.join(row['gemms']) or '-'} casts={row['casts']}"
    if row.get("numerics_only"):
        extra += "  (numerics only: emulated GEMMs)"
    return (
        head + f"{row['ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s "
        f"(warmup {row['warmup_s']:.1f} s){extra}"
    )
