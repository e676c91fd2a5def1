"""An MoE layer's experts, forward + backward: bf16 grouped GEMMs against lowp's recipes
and torchao's prototype, in PyTorch and JAX (the "moe" section of bench/run.py).

The layer is `GroupedExperts` (lowp_torch): E SwiGLU experts with stacked w1, w3
(E, F, D) and w2 (E, D, F), over T routed tokens sorted by expert. Variants, timed
side by side on the same x, weights, routing and cotangent:

  bf16     torch._grouped_mm in bfloat16 (the experts' own high-precision path)
  lowp     lowp_torch.grouped_mm with a recipe (float8_rowwise on the H200:
           torch._scaled_grouped_mm for the three GEMMs)
  torchao  torchao.prototype.moe_training's fp8 rowwise grouped GEMM, where it imports

eager and compiled (`torch.compile` of the layer). JAX: the same layer with
`jax.lax.ragged_dot` in bf16 against `lowp_jax.ragged_dot`, under jit.

Recipes: by default those with a real fp8 grouped kernel on the device (`recipes_to_time`),
others only when named with --recipes; the JAX rows time lowp only for named recipes
(its grouped GEMMs are emulated everywhere for now).

Routing: "balanced" gives every expert T/E tokens; "skewed" gives expert e a share
proportional to 1/(e+1). Every count is a multiple of 16, the token alignment
torch._scaled_grouped_mm asks for (torchao pads to it; here the router does).
"""

import dataclasses
import importlib.util

import numpy as np
import torch

import lowp_torch
from bench import _timing

ROUTINGS = ("balanced", "skewed")
ALIGN = 16


@dataclasses.dataclass(frozen=True)
class MoEShape:
    experts: int
    dim: int  # D, the model dim
    hidden: int  # F, each expert's hidden dim
    tokens: int  # T, routed tokens (tokens x top-k)

    @property
    def key(self) -> str:
        return f"E{self.experts}xD{self.dim}xF{self.hidden}xT{self.tokens}"

    @property
    def flops(self) -> int:
        """Forward + backward of the three GEMMs: 3 GEMMs x 3 passes x 2 T D F."""
        return 18 * self.tokens * self.dim * self.hidden


# DeepSeek-V3-like (large experts) and Llama-4 / fine-grained (small experts)
FULL = (MoEShape(8, 5120, 8192, 16384), MoEShape(16, 4096, 2048, 16384))
SMALL = (MoEShape(4, 64, 128, 256),)


def counts(shape: MoEShape, routing: str) -> torch.Tensor:
    """Tokens per expert (int64), multiples of ALIGN summing to T."""
    units = shape.tokens // ALIGN
    if routing == "balanced":
        share = np.ones(shape.experts)
    elif routing == "skewed":
        share = 1.0 / np.arange(1, shape.experts + 1)
    else:
        raise ValueError(f"unknown routing {routing!r}; expected one of {ROUTINGS}")
    per = np.floor(share / share.sum() * units).astype(np.int64)
    per[0] += units - per.sum()
    return torch.tensor(per * ALIGN)


def torchao_problem(device) -> str | None:
    """Why torchao's MoE prototype cannot run here, or None."""
    if device.type != "cuda":
        return "torchao's fp8 grouped GEMM needs CUDA"
    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed"
    try:
        from torchao.prototype.moe_training import _to_fp8_rowwise_then_scaled_grouped_mm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken install is a reason, not a crash
        return f"torchao.prototype.moe_training does not import: {type(e).__name__}: {e}"
    return None


class _TorchaoExperts(lowp_torch.GroupedExperts):
    """GroupedExperts whose grouped GEMMs are torchao's fp8 rowwise prototype."""

    def _mm(self, x, w, offs):
        from torchao.prototype.moe_training import _to_fp8_rowwise_then_scaled_grouped_mm

        # torchao 0.18 asserts pad_token_groups_for_grouped_mm=False (its padding is not
        # implemented yet): the bench's routing keeps every group a multiple of ALIGN.
        # w.transpose(-2, -1) is (E, K, N) with strides (N K, 1, K): the column-major
        # B_t it asks for.
        return _to_fp8_rowwise_then_scaled_grouped_mm(
            x, w.transpose(-2, -1), offs, pad_token_groups_for_grouped_mm=False
        )


def recipes_to_time(recipes, device, named: bool) -> tuple[list, list]:
    """(recipes to time, [(recipe, why skipped)]): by default only those whose three
    grouped GEMMs run on an fp8 grouped kernel on `device` (float8_rowwise on sm_90+);
    an emulated recipe (float32 GEMMs of dequantized operands: float8_tensorwise took
    369 ms and float8_rowwise_gw_hp 220 ms at E8 x D5120 x F8192 on the H200) only when
    `named` on the command line (--recipes)."""
    from lowp_torch import _grouped_mm

    kept, skipped = [], []
    for recipe in recipes:
        why = _grouped_mm.kernel_problem(recipe, device)
        if why is None or named:
            kept.append(recipe)
        else:
            skipped.append((recipe, why))
    return kept, skipped


def make_experts(impl: str, recipe: str | None, weights) -> torch.nn.Module:
    cls = _TorchaoExperts if impl == "torchao" else lowp_torch.GroupedExperts
    e, f, d = weights[0].shape
    module = cls(d, f, e, recipe=recipe if impl == "lowp" else None, dtype=weights[0].dtype)
    module = module.to(weights[0].device)
    with torch.no_grad():
        for p, w in zip((module.w1, module.w2, module.w3), weights, strict=True):
            p.copy_(w)
    return module


def inputs(shape: MoEShape, routing: str, device) -> tuple:
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*dims, scale=1.0):
        return (torch.randn(*dims, generator=gen) * scale).to(device, torch.bfloat16)

    e, d, f, t = shape.experts, shape.dim, shape.hidden, shape.tokens
    weights = (
        randn(e, f, d, scale=d**-0.5),
        randn(e, d, f, scale=f**-0.5),
        randn(e, f, d, scale=d**-0.5),
    )
    return randn(t, d), weights, randn(t, d), counts(shape, routing).to(device)


def fwd_bwd(module, x, dy, num_tokens):
    x = x.detach().requires_grad_(True)
    params = list(module.parameters())

    def call():
        x.grad = None
        for p in params:
            p.grad = None
        module(x, num_tokens).backward(dy)

    return call


def measure_interleaved(shape, routing, mode, variants, device, timing, backend, on_error):
    """One row per (impl, recipe) variant of the layer, timed side by side."""
    x, weights, dy, num_tokens = inputs(shape, routing, device)

    def build(variant):
        impl, recipe = variant
        module = make_experts(impl, recipe, weights)
        if mode == "compiled":
            module = torch.compile(module, backend=backend, dynamic=False)
        call = fwd_bwd(module, x, dy, num_tokens)
        call()  # a failure to build or compile belongs to this variant
        return call

    kept, built = _timing.build_each(variants, build, on_error)
    measured = _timing.time_interleaved(built, _timing.torch_sync(device), timing)
    rows = []
    for (impl, recipe), result in zip(kept, measured, strict=True):
        row = {
            "shape": shape.key,
            "routing": routing,
            "impl": impl,
            "recipe": recipe or "bf16",
            "mode": mode,
            "ms": round(result.ms, 4),
            "tflops": round(shape.flops / (result.ms * 1e-3) / 1e12, 2),
            "warmup_s": round(result.warmup_s, 2),
            "iters": result.iters,
        }
        if impl == "lowp":  # the GEMMs run on fp8 kernels on sm_90+ for float8 rowwise only
            row["numerics_only"] = device.type != "cuda" or recipe != "float8_rowwise"
        rows.append(row)
    return rows


def jax_measure(shape: MoEShape, routing: str, recipes, timing) -> list[dict]:
    """The layer in JAX under jit: value and grad of <out, dy> with bf16 ragged_dot and
    with lowp_jax.ragged_dot per recipe."""
    import jax
    import jax.numpy as jnp

    import lowp_jax

    x, weights, dy, num_tokens = inputs(shape, routing, torch.device("cpu"))

    def to_jax(t):
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)

    x, dy = to_jax(x), to_jax(dy)
    # rhs of ragged_dot is (G, K, N): the nn.Linear weights transposed
    w1, w2, w3 = (jnp.swapaxes(to_jax(w), 1, 2) for w in weights)
    sizes = jnp.asarray(num_tokens.numpy().astype(np.int32))

    def layer(mm):
        def loss(x, w1, w2, w3):
            h = jax.nn.silu(mm(x, w1)) * mm(x, w3)
            return jnp.sum((mm(h, w2) * dy).astype(jnp.float32))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))

    variants = [("bf16", None, lambda a, b: jax.lax.ragged_dot(a, b, sizes))]
    for recipe in recipes:
        variants.append(
            ("lowp", recipe, lambda a, b, r=recipe: lowp_jax.ragged_dot(a, b, sizes, recipe=r))
        )
    rows = []
    for impl, recipe, mm in variants:
        result = _timing.time_jax(layer(mm), (x, w1, w2, w3), timing)
        rows.append(
            {
                "shape": shape.key,
                "routing": routing,
                "impl": f"jax_{impl}",
                "recipe": recipe or "bf16",
                "mode": "jit",
                "ms": round(result.ms, 4),
                "tflops": round(shape.flops / (result.ms * 1e-3) / 1e12, 2),
                "warmup_s": round(result.warmup_s, 2),
                "iters": result.iters,
                "numerics_only": impl == "lowp",  # emulated GEMMs everywhere, for now
            }
        )
    return rows


def format_row(row: dict) -> str:
    label = f"{row['impl']} {row['recipe']}"
    extra = "  (numerics only: emulated GEMMs)" if row.get("numerics_only") else ""
    return (
        f"{row['shape']:>24} {row['routing']:>8} {label:>24} {row['mode']:>8}: "
        f"{row['ms']:9.4f} ms {row['tflops']:8.2f} TFLOP/s (warmup {row['warmup_s']:.1f} s)" + extra
    )
