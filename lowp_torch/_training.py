"""Low-precision training of a linear layer: the three GEMMs of a `lowp.Recipe` (spec §8),
run as the recipe's `lowp.extend.LinearPlan` says.

For `y = x @ w.T` with x (M, K) (leading dims flattened into M, the tokens), w (N, K)
and g = dL/dy (M, N), the plan gives each GEMM `a @ b.T` its operands, which tensor
each is made of, whether the GEMM reads it transposed, and its scheme along the
operand's last axis, the reduction axis:

    forward  y  = x   @ w.T     a = x   (M, K)   b = w   (N, K)   reduce over K
    dgrad    dx = g   @ w       a = g   (M, N)   b = w.T (K, N)   reduce over N
    wgrad    dw = g.T @ x       a = g.T (N, M)   b = x.T (K, M)   reduce over M

This module executes it. A transposed operand is quantized where its tensor lies,
along the first axis (`OperandPlan.along_first_axis`), and viewed transposed
(`_transposed`): the same groups, so the bytes of quantizing the transposed copy. Where
the plan reuses codes (`OperandPlan.reuses_codes`: the very scheme the tensor was
quantized with before, tensorwise or square 128x128 blocks), the operand is those
codes, transposed, and the earlier GEMM keeps them for the later one instead of the
high-precision tensor.

Where the Triton casts quantize (CUDA, `_cast_kernels.use_triton`), a tensor whose two
GEMMs take the very same scheme (`OperandPlan.shares_scheme`: x, w and dy under
float8_rowwise and mxfp8; w under mxfp8_gw_hp) or reuse its codes under tensorwise
scaling (float8_tensorwise's x, w and dy) is quantized both ways from one read
(`_triton_casts.quantize_both`); its codes along the first axis are those
`_transposed` would make, written transposed, so the backward GEMMs copy no codes
(elsewhere, and for FSDP2's gathered weights, reused codes are copied transposed). The
forward keeps them (one byte an element) for the backward instead of the
high-precision x or w, and the dgrad those of dy for the wgrad (`_quantize_and_keep`).
The bytes are the same on every path.

Scaling is current (dynamic): every scale comes from the tensor it scales, at the call.
Nothing carries over between steps, so a run is a function of its parameters,
optimizer state and data alone, and a checkpoint resumes it exactly.
"""

import dataclasses
import math

import torch
import torch.nn.functional as F

import lowp
from lowp import extend
from lowp_torch import (
    _bits,
    _cast_kernels,
    _gemm,
    _log,
    _qtensor,
    _quantize,
    _rounding,
    _tensor_ops,
)

QuantizedTensor = _qtensor.QuantizedTensor
KERNELS = ("auto", "scaled_mm", "emulated")
SMALL_SHAPES = ("auto", "quantize")


@dataclasses.dataclass(frozen=True)
class Lowering:
    """How a training layer's GEMMs run (what they compute is the recipe's business).

    Attributes:
      kernel: "auto", "scaled_mm" or "emulated", as for `scaled_matmul` (fbgemm's fp8
        GEMMs take e4m3 operands only, so no fbgemm for the e5m2 gradients).
      pad_to_16: zero-pad each GEMM's K and N to multiples of 16 for the fp8 kernels
        (exact: zero codes add nothing).
      name: the layer, for errors and logs.
      small_shapes: "auto" runs a call in high precision where the fp8 GEMM kernels
        would run it but it is too small for them to pay for the casts
        (`lowp._small_shapes`); "quantize" always runs the recipe.
    """

    kernel: str = "auto"
    pad_to_16: bool = False
    name: str = "linear"
    small_shapes: str = "auto"

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"Lowering.name must be a str, got {self.name!r}")
        if self.kernel not in KERNELS:
            raise ValueError(
                f"{self.name}: kernel must be one of {KERNELS} for training, got {self.kernel!r}"
            )
        if not isinstance(self.pad_to_16, bool):
            raise TypeError(f"{self.name}: pad_to_16 must be a bool, got {self.pad_to_16!r}")
        if self.small_shapes not in SMALL_SHAPES:
            raise ValueError(
                f"{self.name}: small_shapes must be one of {SMALL_SHAPES}, "
                f"got {self.small_shapes!r}"
            )


# --- the operands of each GEMM ---


def training_operands(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, recipe) -> dict:
    """The quantized operands of the three GEMMs `recipe` runs for one linear layer.

    Computed by the functions `lowp_torch.Linear` feeds its GEMMs with, so a test sees
    the bytes that reach them; `lowp_jax.training_operands` answers the same question,
    which lets the two frameworks be compared byte for byte.

    Args:
      x: the input, (..., K), float32/bfloat16/float16; leading dims flatten into M.
      w: the weight, (N, K): `(out_features, in_features)` in both frameworks.
      g: the gradient of the output, (..., N), with x's leading dims.
      recipe: a `lowp.Recipe` or its name.

    Returns:
      {"forward": (a, b), "dgrad": (a, b), "wgrad": (a, b)}: for each GEMM `a @ b.T`
      the QuantizedTensors a, b, shaped (M, K), (N, K); (M, N), (K, N); (N, M), (K, M).
      Each holds the bytes of `lowp_torch.quantize` (and `lowp.quantize`) of that
      orientation of the high-precision tensor with the recipe's scheme. A GEMM the
      recipe runs in high precision maps to None.

    >>> import torch, lowp_torch
    >>> ops = lowp_torch.training_operands(
    ...     torch.ones(4, 32), torch.ones(64, 32), torch.ones(4, 64), "mxfp8_gw_hp")
    >>> [tuple(q.shape) for q in ops["dgrad"]], ops["wgrad"]
    ([(4, 64), (32, 64)], None)
    """
    plan = extend.LinearPlan.of(lowp.Recipe.of(recipe))
    if (
        w.dim() != 2
        or x.dim() < 1
        or x.shape[-1] != w.shape[1]
        or g.shape != x.shape[:-1] + w.shape[:1]
    ):
        raise ValueError(
            f"training_operands takes x (..., K), w (N, K) and g (..., N) with x's leading dims; "
            f"got x {tuple(x.shape)}, w {tuple(w.shape)}, g {tuple(g.shape)}"
        )
    check_layer(plan, w.shape[1], w.shape[0], Lowering())
    check_tokens(plan, x, w, Lowering())
    x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    (a, b), (keep_x, keep_w) = forward_operands(x2, w, plan)
    dgrad, keep_g = dgrad_operands(g2, keep_w, plan)
    wgrad = wgrad_operands(keep_g, keep_x, plan)
    return {"forward": (a, b), "dgrad": dgrad, "wgrad": wgrad}


def forward_operands(x2, w, plan, name="linear", dgrad_runs=True, wgrad_runs=True):
    """(a, b) of y = x @ w.T: x (M, K) and w (N, K), quantized along K; and (keep_x,
    keep_w), what the wgrad's x.T and the dgrad's w.T take of x and w: codes made now,
    or the high-precision tensors (`_quantize_and_keep`). `dgrad_runs`, `wgrad_runs`:
    whether those GEMMs will run, so whether codes made now for them are of any use."""
    forward = plan.forward
    a, keep_x = _quantize_and_keep(
        x2, forward.a, plan.transposed_operand("x"), wgrad_runs, f"{name} forward: x"
    )
    gathered = getattr(w, "lowp_gathered_operands", None)  # FSDP2 gathered codes: `_fsdp`
    if gathered is not None:
        b, keep_w = gathered(forward.b)
    else:
        b, keep_w = _quantize_and_keep(
            w, forward.b, plan.transposed_operand("w"), dgrad_runs, f"{name} forward: w"
        )
    return (a, b), (keep_x, keep_w)


def dgrad_operands(g2, w, plan, name="linear", wgrad_runs=True):
    """(a, b) of dx = g @ w: g (M, N) and w.T (K, N), quantized along N, or None for a
    high-precision GEMM; and keep_g, what the wgrad's dy.T takes of dy: codes made now,
    or dy itself (`_quantize_and_keep`). `w`: the weight, or the forward's codes of it."""
    dgrad = plan.dgrad
    if dgrad is None:
        return None, g2
    if hasattr(w, "lowp_dgrad_operand"):  # FSDP2 gathers it for the backward: `_fsdp`
        w = w.lowp_dgrad_operand()
    a, keep_g = _quantize_and_keep(
        g2, dgrad.a, plan.transposed_operand("g"), wgrad_runs, f"{name} dgrad: dy"
    )
    return (a, _transposed(w, dgrad.b, f"{name} dgrad: w.T")), keep_g


def wgrad_operands(g2, x2, plan, name="linear"):
    """(a, b) of dw = g.T @ x: g.T (N, M) and x.T (K, M), quantized along the tokens M;
    None for a high-precision GEMM. `g2`, `x2`: the high-precision tensors, or the codes
    of them that `dgrad_operands` and `forward_operands` kept."""
    wgrad = plan.wgrad
    if wgrad is None:
        return None
    return (
        _transposed(g2, wgrad.a, f"{name} wgrad: dy.T"),
        _transposed(x2, wgrad.b, f"{name} wgrad: x.T"),
    )


def _quantize_and_keep(t, operand, later, later_runs: bool, name: str):
    """(t quantized as `operand` says, what the `later` operand, t read transposed, keeps
    of t): codes of t made now, which `_transposed` views transposed, else t itself, to
    be quantized then. `later`: None where that GEMM runs in high precision.

    Codes are made now, the bytes `_transposed(t, later)` would make, where
    - `quantize_both` makes both from one read of t (`_one_read`) and the later GEMM
      will run: its codes along t's first axis (for tensorwise scaling, t's codes
      written transposed), kept in fp8 instead of t;
    - else the plan reuses t's codes (`OperandPlan.reuses_codes`): t's codes, which
      the later GEMM copies transposed.
    """
    if later_runs and _one_read(t, later, name):
        from lowp_torch import _triton_casts  # imports triton: only when it runs

        return _triton_casts.quantize_both(t, operand.scheme)
    if later is not None and later.reuses_codes:  # operand is plain (`OperandPlan.earlier`)
        q = _quantize_operand(t, operand, name)
        return q, q
    return _quantize_operand(t, operand, name), t


def _quantize_operand(t, operand, name: str) -> QuantizedTensor:
    """t (the operand as the GEMM reads it) quantized as `operand` says: `quantize` with
    its scheme, after the random Hadamard transform where the plan asks for it, with
    stochastic rounding from the recipe's seed and t's data where it asks for that
    (spec §8, `OperandPlan.quantize_reference`)."""
    if operand.plain:
        return _quantize.quantize(t, operand.scheme, name=name)
    if operand.hadamard:
        signs = _hadamard_signs(operand.recipe_seed, t.shape[-1], t.device)
        t = extend.hadamard_transform(_bits.ftz(t.float()), signs, stack=torch.stack, ftz=_bits.ftz)
    if operand.rounding == "nearest":
        return _quantize.quantize(t, operand.scheme, name=name)
    patterns = _bits.bits(_bits.ftz(t.float())).to(torch.int64) & 0xFFFFFFFF
    offset = patterns.sum() & 0xFFFFFFFF  # extend.data_offset, on the device
    random = _rounding.random_bits(operand.rounding_seed, tuple(t.shape), offset, device=t.device)
    return _quantize.quantize(
        t, operand.scheme, rounding="stochastic", random_bits=random, name=name
    )


@torch.library.custom_op("lowp::hadamard_signs", mutates_args=())
def _hadamard_signs(seed: int, length: int, device: torch.device) -> torch.Tensor:
    """`OperandPlan.signs(length)` of a recipe of seed `seed`, float32 on `device`. An
    opaque op: torch.compile cannot trace the crc32 the signs are drawn from, and the
    length (the token count of the wgrad) may be symbolic."""
    return torch.from_numpy(extend.hadamard_signs(seed, "", (length,))).to(device)


@_hadamard_signs.register_fake
def _(seed, length, device):
    return torch.empty(16, dtype=torch.float32, device=device)  # one sign per row of H16


def _one_read(t, later, name: str) -> bool:
    """Whether `quantize_both(t, scheme)` gives t's codes for its earlier GEMM and those
    `_transposed(t, later)` makes: the plan says both GEMMs take the very scheme, which
    applies along t's first axis (`OperandPlan.shares_scheme`) or reuses t's codes
    (`OperandPlan.reuses_codes`, tensorwise), and `quantize` takes the Triton casts for
    t with it in both orientations (eager, CUDA or the forced interpreter, shapes that
    suit, TensorScaling, AxisScaling or MXScaling)."""
    return (
        later is not None
        and (later.shares_scheme or later.reuses_codes)
        and isinstance(later.scheme, (lowp.TensorScaling, lowp.AxisScaling, lowp.MXScaling))
        and t.dim() == 2
        and all(
            _cast_kernels.use_triton(
                t,
                s,
                rounding="nearest",
                random_bits=None,
                seed=None,
                offset=0,
                check_finite=False,
                name=name,
            )
            for s in dict.fromkeys((later.scheme, later.along_first_axis))  # tensorwise: one
        )
    )


def _transposed(t, operand, name: str) -> QuantizedTensor:
    """`t.T` quantized as `operand` (a transposed operand of the plan) says, for a 2-D t.

    t is quantized where it lies, along its first axis (`OperandPlan.along_first_axis`),
    and the result viewed transposed: the same groups, so the bytes of quantizing the
    transposed copy, without making one (Transformer Engine's "columnwise" quantization
    does the same). Fused with the quantization of t along its last axis, the transposed
    copy also trips an Inductor CPU codegen assertion for MX blocks (torch 2.13,
    `try_loop_split`). Packed fp4 codes must run along the last axis: those schemes
    quantize the copy.
    """
    if isinstance(t, QuantizedTensor):  # codes already made (`_quantize_and_keep`)
        return _tensor_ops.permute(t, [1, 0], op="transpose")
    along_first = operand.along_first_axis
    if along_first is None:
        return _quantize_operand(t.t().contiguous(), operand, name)
    q = _quantize.quantize(t, along_first, name=name)
    return _tensor_ops.permute(q, [1, 0], op="transpose")


# --- the autograd Function ---


def quantized_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    plan: extend.LinearPlan,
    lowering: Lowering,
    main_grad: torch.Tensor | None = None,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` with its forward and backward GEMMs run as the plan of
    a recipe says: `lowp_torch.Linear`'s call where the small-shape policy
    (`in_high_precision`) has not sent it to `high_precision_linear`.

    y and dx have x's dtype (under autocast, the autocast dtype: x is cast to it, as
    `F.linear` would; the weight is quantized from its own dtype), dw the weight's, db
    the bias's. With `main_grad`, a float32 tensor shaped like the weight, the weight
    gradient is computed in float32 and added into it instead of going to autograd
    (see `lowp_torch.Linear`).
    """
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type)
    if autocast:
        x = x.to(torch.get_autocast_dtype(device_type))
    grad_enabled = torch.is_grad_enabled()
    if grad_enabled and weight.requires_grad:  # else no wgrad GEMM will run
        check_tokens(plan, x, weight, lowering)
    if not autocast:  # no block to enter (its Python is host time at every call)
        return _LinearFunction.apply(x, weight, bias, main_grad, plan, lowering, grad_enabled)
    # The emulated GEMMs are float32 matmuls: autocast must not lower them.
    with torch.autocast(device_type, enabled=False):
        return _LinearFunction.apply(x, weight, bias, main_grad, plan, lowering, grad_enabled)


def in_high_precision(x, weight, recipe, lowering: Lowering) -> bool:
    """The small-shape policy (`lowp._small_shapes`): whether this call of the layer runs
    in high precision, because the fp8 GEMM kernels would run it at a loss. Says so
    once per layer and reason, at INFO."""
    if lowering.small_shapes != "auto" or not fp8_kernels_run(recipe, weight.device, lowering):
        return False
    if hasattr(weight, "lowp_gathered_operands"):  # codes only: no values to run on
        return False
    n, k = weight.shape
    tokens = x.numel() // k
    traced = torch.compiler.is_compiling()  # the call has no host time of its own (not logged)
    if extend.call_pays(tokens, k, n, recipe.name, traced):
        return False
    small_layer = not extend.layer_may_pay(k, n, recipe.name)
    _log.info_once(  # once per layer and reason, whatever M (sequence lengths vary)
        (lowering.name, "small shapes", small_layer),
        lambda: (
            f"{lowering.name}: {recipe.name} runs in high precision "
            f"({extend.describe_small_shape(tokens, k, n, recipe.name, traced)}); "
            "small_shapes='quantize' forces fp8"
        ),
    )
    return True


def fp8_kernels_run(recipe, device: torch.device, lowering: Lowering) -> bool:
    """Whether the recipe's GEMMs get real low-precision kernels on `device` (else they
    are emulated, and the layer is there for its numerics): float8 on CUDA sm_89+,
    MX and NVFP4 on sm_100+, unless kernel="emulated"."""
    if lowering.kernel == "emulated" or device.type != "cuda":
        return False
    # Ints, not tuples: torch 2.11's Dynamo fails comparing the tuple that
    # assume_constant_result returns (InternalTorchDynamoError in a guard, seen on the
    # H200 with a compiled lowp_torch.Linear).
    major, minor = _gemm._cuda_capability(device.index)
    return 10 * major + minor >= (100 if recipe.block_scaled else 89)


def high_precision_linear(x, weight, bias, main_grad, device_type: str):
    """The layer in high precision (what the small-shape policy falls back to): every
    GEMM in x's dtype (autocast's, under autocast), accumulated in float32 and rounded
    once, as the recipes' high-precision GEMMs and lowp_jax's fallback run; dw in the
    weight's dtype, or added into `main_grad` in float32. Where x and the weight share
    a dtype and nothing else applies, that is `F.linear` itself, the float layer's call."""
    if main_grad is None and weight.dtype == x.dtype and not torch.is_autocast_enabled(device_type):
        return F.linear(x, weight, bias)
    if torch.is_autocast_enabled(device_type):
        x = x.to(torch.get_autocast_dtype(device_type))
    with torch.autocast(device_type, enabled=False):
        return _HighPrecisionFunction.apply(x, weight, bias, main_grad)


class _HighPrecisionFunction(torch.autograd.Function):
    """y = x w^T + b in x's dtype, the bias added to the float32 accumulator before the
    one rounding (the quantized GEMMs' epilogue); dx in x's dtype, dw in the weight's or
    added into main_grad in float32, each rounded once from float32 (`_high_precision_mm`)."""

    @staticmethod
    def forward(ctx, x, weight, bias, main_grad):
        x2 = x.reshape(-1, x.shape[-1])
        y = _high_precision_mm(x2, weight.t().to(x.dtype), torch.float32)
        if bias is not None:
            y = y + bias.float()
        ctx.save_for_backward(x2, weight)
        ctx.main_grad, ctx.x_shape, ctx.has_bias = main_grad, x.shape, bias is not None
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        g2 = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _high_precision_mm(g2, weight.to(g2.dtype), x2.dtype).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            if ctx.main_grad is None:
                dw = _high_precision_mm(g2.t(), x2.to(g2.dtype), weight.dtype)
            else:
                ctx.main_grad.add_(_high_precision_mm(g2.t(), x2.to(g2.dtype), torch.float32))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g2.sum(0)
        return dx, dw, db, None


class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, main_grad, plan, lowering, grad_enabled):
        x2 = x.reshape(-1, x.shape[-1])
        # The forward itself runs without grad, and needs_input_grad ignores no_grad:
        # `grad_enabled` says whether a backward can follow at all.
        dgrad_runs = grad_enabled and ctx.needs_input_grad[0]
        wgrad_runs = grad_enabled and ctx.needs_input_grad[1]
        (a, b), kept = forward_operands(x2, weight, plan, lowering.name, dgrad_runs, wgrad_runs)
        y = _product(a, b, plan.forward, x.dtype, lowering, bias)
        ctx.save_for_backward(*kept)
        # main_grad is not a saved tensor: the backward adds into it, and a layer used
        # twice in one step would find the version it saved already bumped.
        ctx.plan, ctx.lowering, ctx.main_grad = plan, lowering, main_grad
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        keep_x, keep_w = ctx.saved_tensors
        plan, lowering, main_grad = ctx.plan, ctx.lowering, ctx.main_grad
        g2 = dy.reshape(-1, dy.shape[-1])
        dgrad_runs, wgrad_runs = ctx.needs_input_grad[:2]
        dx = dw = db = None
        keep_g = g2
        if dgrad_runs:
            dgrad, keep_g = dgrad_operands(g2, keep_w, plan, lowering.name, wgrad_runs)
            if dgrad is None:
                dx = _high_precision_mm(g2, keep_w.t(), ctx.x_dtype)
            else:
                dx = _product(*dgrad, plan.dgrad, ctx.x_dtype, lowering)
            dx = dx.reshape(ctx.x_shape)
        if wgrad_runs:
            out_dtype = ctx.w_dtype if main_grad is None else torch.float32
            wgrad = wgrad_operands(keep_g, keep_x, plan, lowering.name)
            if wgrad is None:
                dw = _high_precision_mm(g2.t(), keep_x, out_dtype)
            else:
                dw = _product(*wgrad, plan.wgrad, out_dtype, lowering)
            if main_grad is not None:
                main_grad.add_(dw)
                dw = None
        if ctx.needs_input_grad[2]:
            db = g2.sum(0)
        return dx, dw, db, None, None, None, None


def _high_precision_mm(a: torch.Tensor, b: torch.Tensor, out_dtype) -> torch.Tensor:
    """`a @ b` of a GEMM the recipe runs in high precision: float32 products and sums,
    rounded once to out_dtype, as lowp_jax's (`preferred_element_type=float32`) and as the
    quantized GEMMs' float32 accumulators. 16-bit operands of one dtype on CUDA take
    cuBLAS's 16-bit GEMM with a float32 output (`torch.mm(..., out_dtype=)`): the same
    arithmetic at 16-bit speed; elsewhere the operands are widened (exactly) first."""
    if (
        a.is_cuda
        and a.dtype == b.dtype
        and a.dtype in (torch.bfloat16, torch.float16)
        and _MM_TAKES_OUT_DTYPE
    ):
        return torch.mm(a, b, out_dtype=torch.float32).to(out_dtype)
    return torch.mm(a.float(), b.float()).to(out_dtype)


# torch.mm(a, b, out_dtype=torch.float32) for 16-bit CUDA operands (the aten::mm.dtype
# overload, torch >= 2.8).
_MM_TAKES_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")


def _product(a, b, gemm, out_dtype, lowering, bias=None) -> torch.Tensor:
    """One quantized GEMM `a @ b.T` (`gemm`, its plan) on the kernel `lowering` picks."""
    _, k, n = gemm.dims  # what the GEMM's K and N are in the layer's terms, for messages
    return _gemm.scaled_matmul(
        a,
        b,
        out_dtype=out_dtype,
        bias=bias,
        kernel=lowering.kernel,
        fast_accum=gemm.fast_accum,
        pad_to_16=lowering.pad_to_16,
        name=f"{lowering.name} {gemm.name}",
        dim_names=(extend.DIM_NAMES[k], extend.DIM_NAMES[n]),
    )


# --- shape checks, before any GEMM runs ---


def check_layer(plan, in_features: int, out_features: int, lowering: Lowering) -> None:
    """ValueError naming the layer if its K or N does not suit the recipe's schemes
    (`LinearPlan.check`: an MX block must divide K for the forward and N for the dgrad),
    or, for an explicitly requested fp8 kernel without padding, is not a multiple of 16."""
    where = f"{lowering.name} (in_features={in_features}, out_features={out_features})"
    if lowering.kernel == "scaled_mm" and not lowering.pad_to_16:
        for dim, size in (("in_features", in_features), ("out_features", out_features)):
            if size % 16:
                raise ValueError(
                    f"{where}: {dim}={size} is not a multiple of 16, which kernel='scaled_mm' "
                    "needs; pass pad_to_16=True (zero-pads, exact), kernel='auto' (emulates "
                    "such GEMMs), or skip the layer with filter_fn"
                )
    try:
        plan.check(None, in_features, out_features)  # the tokens M are unknown until a call
    except ValueError as e:
        raise ValueError(f"{where}: {e}. Skip the layer with filter_fn") from e


def check_tokens(plan, x: torch.Tensor, weight: torch.Tensor, lowering: Lowering) -> None:
    """ValueError naming the layer if the token count M (the wgrad GEMM's reduction
    dim) does not suit the recipe's wgrad schemes (`LinearPlan.check`: an MX block must
    divide it) or, for an explicitly requested fp8 kernel without padding, is not a
    multiple of 16."""
    if plan.wgrad is None:
        return
    m = math.prod(x.shape[:-1])

    def where():
        lead = tuple(x.shape[:-1])
        return f"{lowering.name}: the input has M={m} tokens (its leading dims {lead})"

    if lowering.kernel == "scaled_mm" and not lowering.pad_to_16 and m % 16:
        raise ValueError(
            f"{where()}, the reduction dim of the {plan.recipe.name} wgrad GEMM; "
            "kernel='scaled_mm' needs a multiple of 16: pass pad_to_16=True "
            "(zero-pads, exact) or kernel='auto'"
        )
    try:
        plan.check(m, weight.shape[1], weight.shape[0])
    except ValueError as e:
        raise ValueError(f"{where()}: {e}") from e
