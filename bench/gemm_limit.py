"""The "limit" of a training recipe: its three GEMMs alone, operands already quantized.

A linear layer's forward + backward under a recipe cannot beat the time of its three
GEMMs (forward, dgrad, wgrad) on operands that are already quantized and already laid
out as the kernel reads them; the casts, transposes and everything else come on top.
The operands here are `lowp_torch.training_operands` (the bytes the layer's GEMMs get)
turned into `torch._scaled_mm`'s inputs by lowp_torch's own `_padded_operands` (codes
contiguous, reduction axis last; rowwise scales (M, 1) and (1, N); a tensorwise scale
beside a rowwise one repeated per row), all before timing; each GEMM then runs with the
recipe's fast-accumulation flag and a bfloat16 output. A GEMM the recipe keeps in high
precision (the `_gw_hp` wgrad) is the bf16 matmul the layer runs.

The blockwise recipes' 1x128 / 128x128 operands take `torch._scaled_mm`'s block-scaled
forms on sm_90 (exact accumulation, as the layer runs them). MX recipes have no fp8 GEMM
on Hopper (block scales inside the K loop need sm_100's block-scaled GEMM): their limit
is reported as None with that reason.
"""

import torch

import lowp
import lowp_torch
from bench import _timing
from lowp_torch import _gemm


def gemm_calls(recipe: lowp.Recipe, x, weight, dy) -> list:
    """Three zero-argument callables, forward, dgrad and wgrad, ready to time.

    ValueError naming the GEMM if one has no fp8 kernel here (an MX pair)."""
    operands = lowp_torch.training_operands(x, weight, dy, recipe)
    calls = []
    for gemm in ("forward", "dgrad", "wgrad"):
        pair = operands[gemm]
        if pair is None:  # high precision, as _training.py runs it
            a, b = {"forward": (x, weight), "dgrad": (dy, weight.t()), "wgrad": (dy.t(), x.t())}[
                gemm
            ]
            a, b = a.contiguous(), b.contiguous()
            calls.append(lambda a=a, b=b: a @ b.t())
            continue
        form = _gemm.gemm_form(*pair)
        if form not in ("tensorwise", "rowwise", "block"):
            raise ValueError(
                f"{recipe.name} {gemm}: {form} operands have no torch._scaled_mm kernel on "
                "this GPU (MX needs sm_100's block-scaled GEMM)"
            )
        a_codes, b_codes, a_scale, b_scale, _ = _gemm._padded_operands(*pair, form, False)
        fast_accum = getattr(recipe, gemm).fast_accum and form != "block"  # as _gemm runs it
        calls.append(
            lambda a=a_codes, b=b_codes, sa=a_scale, sb=b_scale, fast=fast_accum: torch._scaled_mm(
                a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16, use_fast_accum=fast
            )
        )
    return calls


def measure(recipe_name: str, tensors, timing: _timing.Timing) -> dict:
    """One row: the median time of the three GEMMs run back to back."""
    x, weight, dy = tensors
    (m, k), n = x.shape, weight.shape[0]
    row = {"M": m, "K": k, "N": n, "impl": "limit", "recipe": recipe_name, "mode": "-"}
    try:
        calls = gemm_calls(lowp.Recipe.from_name(recipe_name), x, weight, dy)
    except ValueError as e:
        return row | {"ms": None, "why": str(e)}

    def all_three():
        for call in calls:
            call()

    result = _timing.time_calls(all_three, _timing.torch_sync(x.device), timing)
    return row | {
        "ms": round(result.ms, 4),
        "tflops": round(6 * m * k * n / (result.ms * 1e-3) / 1e12, 2),
        "warmup_s": round(result.warmup_s, 2),
        "iters": result.iters,
    }
