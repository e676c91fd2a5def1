"""Linear and matmul with a QuantizedTensor operand: quantize the input, then the GEMM.

The weight carries the activation config
(`QuantizedTensor.linear.activation`), and this override quantizes the input with it
and dispatches the GEMM to `scaled_matmul`, inline:

    F.linear(x, w)   x plain, w.linear.activation set  ->  quantize(x) then scaled_matmul
                     x plain, no activation scheme     ->  weight-only: x @ dequantize(w).T
                     x quantized too                   ->  scaled_matmul
    mm / bmm / addmm with a quantized right operand (K, N): its transpose is the (N, K)
                     weight form (`_tensor_ops.permute`), then as F.linear.

The input is quantized as a 2-D (M, K) matrix: for every preset's activation scheme
(tensor, per-row, 1x128 blocks, MX and NVFP4 along K) that gives the bytes quantizing
the (..., K) tensor would, and it is the shape the GEMM kernels take.

Gradients: the quantized weight gets none (its codes are not parameters). An input
that requires grad gets the straight-through one, `dx = dy @ dequantize(w)` (the
quantization taken as the identity, as `lowp_jax.dot_general` does), so layers before
a quantized one (an unquantized first layer, adapters) still train; the bias gets its
own. Under autocast the input is cast to the autocast dtype (as `F.linear` computes in
it), which is then the output's, and the GEMM itself runs as it would without autocast.
"""

import torch
import torch.nn.functional as F

import lowp
from lowp import extend
from lowp_torch import (
    _cast_kernels,
    _cast_ops,
    _gemm,
    _qtensor,
    _quantize,
    _storage,
    _tensor_ops,
    _weight_cache,
)

QuantizedTensor = _qtensor.QuantizedTensor
_DECODE_MAX_M = 16  # `_triton_decode.MAX_M`, here without importing triton


def linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(input, weight, bias)` where either operand is a QuantizedTensor.

    Output dtype = the input's (its hp_dtype if it is quantized); the bias is added in
    high precision (see `scaled_matmul`). An all-zero input row gives bias (or 0),
    never NaN: its scale comes from the scheme's EPS (spec §6).
    """
    with torch._C.DisableTorchFunctionSubclass():
        return _linear(input, weight, bias)


def _linear(x, w, bias):
    planned = False  # whether a `_plan` holds for this weight and x's device and dtype
    # Dynamo's flag alone misses the AOTAutograd trace on torch 2.11 (`_storage.traced`)
    tracing = _storage.traced(x)
    if not tracing:  # first: no __dict__ for Dynamo to trace, no plan of fake tensors
        plans = w.__dict__.get("_lowp_plans")
        plan = None if plans is None else plans.get((x.device, x.dtype))
        planned = plan is not None and plan.codes is w.codes and plan.scale is w.scale
        y = _planned(x, bias, plan) if planned else None
        if y is not None:
            return y
    if not isinstance(w, QuantizedTensor):  # a quantized input against a plain weight
        return F.linear(_quantize.dequantize(x, w.dtype), w, bias)
    config = _qtensor.linear_of(w)
    if isinstance(x, QuantizedTensor):
        return _gemm_of(x, w, bias, config)
    if config is None or config.activation is None:  # weight-only quantization
        if w.dim() == 2:
            return F.linear(x, _weight_cache.dequantized(w, x.dtype), bias)
        y = torch.matmul(x, _weight_cache.dequantized(w, x.dtype).transpose(-1, -2))
        return y if bias is None else y + bias
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        x = x.to(torch.get_autocast_dtype(device_type))
    with torch.autocast(device_type, enabled=False):
        if torch.is_grad_enabled() and (
            x.requires_grad or (bias is not None and bias.requires_grad)
        ):
            return _StraightThrough.apply(x, bias, w, config)
        if not planned and w.dim() == 2 and not tracing:
            _plan(x, w, config)
        if tracing and w.dim() == 2:
            y = _compiled_decode(x, w, bias, config)
            if y is not None:
                return y
        return _quantized_input(x, w, bias, config)


class _Plan:
    """What one quantize_'d weight's eager calls on one device and input dtype keep
    constant, decided at its first call (`_plan`): the fp8 kernel's weight operand, the
    activation cast, and for calls of few rows the decode kernel (`decode`, or None).
    `codes`, `scale`: the weight parts it was made from; a weight
    whose parts were replaced gets a new plan. The kept operand is a view of those
    parts, so an in-place change of them (`copy_`, `load_state_dict`) reaches it."""

    __slots__ = (
        "b_codes_t",
        "b_scale",
        "codes",
        "decode",
        "decode_codes",
        "decode_scale",
        "epilogue_bias",
        "fast_accum",
        "fmt",
        "form",
        "scale",
        "scheme",
    )

    def __init__(self, w, config, form, b_codes, b_scale, dtype):
        self.codes, self.scale = w.codes, w.scale
        # `scaled_matmul` adds a bias of a 16-bit output's dtype in the kernel's epilogue
        self.epilogue_bias = dtype != torch.float32
        self.scheme, self.form, self.fast_accum = config.activation, form, config.fast_accum
        self.fmt = extend.element_format(config.activation.fmt)
        self.b_codes_t, self.b_scale = b_codes.t(), b_scale
        # The decode kernel's call (`_triton_decode`), for x of at most MAX_M rows: the
        # weight's codes as uint8 and its scales flat, views of the weight's parts.
        self.decode = self.decode_codes = self.decode_scale = None
        if decode_problem(w, config, form) is None:
            from lowp_torch import _triton_decode

            n, k = w.shape
            self.decode = _triton_decode.Decode(
                n, k, dtype, w.codes.device, config.activation, w.scale.numel() != 1
            )
            self.decode_codes = _storage.as_bytes(w.codes)
            self.decode_scale = w.scale.reshape(-1)


def decode_problem(w, config, form) -> str | None:
    """Why the decode kernel (`_triton_decode`) cannot run this weight's small-M calls,
    or None: it takes what `kernel="auto"` would give `torch._scaled_mm` (form
    "tensorwise" or "rowwise", an unmixed pair), e4m3 on both sides, the weight's codes
    contiguous and its scales one or one a row."""
    if config.kernel != "auto":
        return f"kernel={config.kernel!r} asks for another kernel"
    device = w.codes.device
    if device.type == "cuda":
        major, minor = _gemm._cuda_capability(device.index)
        if (major, minor) < (8, 9):
            return f"the decode kernel's float8 loads need sm_89+, this GPU is sm_{major}{minor}"
    elif not _cast_kernels._interpreting():
        return f"the weight is on {device.type}, and the decode kernel runs on CUDA"
    if form not in ("tensorwise", "rowwise"):
        return f"the scheme pair's form is {form}"
    fmts = {config.activation.fmt, _qtensor.scheme_of(w).fmt}
    if fmts != {"float8_e4m3fn"}:
        return f"the decode kernel takes float8_e4m3fn, not {sorted(fmts)}"
    if (
        w.dim() != 2
        or not w.codes.is_contiguous()
        or w.scale.numel() not in (1, w.shape[0])
        or w.scale_layout != "plain"
    ):
        return "the weight's codes are not a contiguous (N, K) matrix with one plain scale or one a row"
    if not _storage.traced(w.codes) and (w.codes.data_ptr() % 16 or w.scale.data_ptr() % 16):
        return "the weight's codes or scales are not 16-byte aligned"  # a plan binds one
    return None


def _plan(x, w, config) -> None:
    """Decide once, for x's device and dtype, whether this weight's calls can take the
    planned path (`_planned`): the fp8 kernel `torch._scaled_mm` chosen by
    `scaled_matmul(kernel="auto")`'s rules for any M (they depend on the device, the
    dtypes, the scheme pair and K, N only), no padding, and the activation cast on the
    Triton kernels (`_cast_kernels.triton_problem`). Where it cannot, nothing is kept
    and the general path runs, as it did."""
    scheme = config.activation
    if (
        config.kernel not in ("auto", "scaled_mm")
        or type(x) is not torch.Tensor
        or _storage.traced(x)
        or not isinstance(scheme, (lowp.TensorScaling, lowp.AxisScaling))
        or _cast_kernels.triton_problem(x, scheme, "nearest", None, None, 0, False) is not None
    ):
        return
    rows = x.reshape(-1, x.shape[-1])
    a = _quantize.quantize(rows[:0], scheme)  # an empty one: its scheme, dtype and device
    form = _unmixed_form(scheme, w)
    if form is None or (
        _gemm.kernel_problem("scaled_mm", a, w, form, x.dtype) is not None
        or _gemm.shape_problem(a, w) is not None
    ):
        return
    b_codes, b_scale = _gemm.b_operand(w, form)
    if b_codes.data_ptr() != w.codes.data_ptr() or b_scale.data_ptr() != w.scale.data_ptr():
        return  # copies (a transposed weight): an in-place change of w would not reach them
    w.__dict__.setdefault("_lowp_plans", {})[(x.device, x.dtype)] = _Plan(
        w, config, form, b_codes, b_scale, x.dtype
    )


def _unmixed_form(scheme, w) -> str | None:
    """The GEMM form ("tensorwise" or "rowwise") of 2-D rows quantized with `scheme`
    against the weight w where both sides scale alike, or None. The rowwise form also
    pairs a tensor-scaled operand with a rowwise one; its one scale would need expanding
    to a row's every call, which the planned path and the decode kernel do not do."""
    w_scheme = _qtensor.scheme_of(w)
    form = _gemm.form_of(scheme, 2, w_scheme, w.dim())
    if form == "rowwise" and type(scheme) is not type(w_scheme):
        return None
    return form if form in ("tensorwise", "rowwise") else None


def _planned(x, bias, plan):
    """The planned call (`_plan`): `_quantized_input`'s bytes and kernel, without its
    per-call checks and wrappers; None where this call needs the general path (autocast,
    grad, a `cast_kernels("torch")` block, torch.compile, a bias of another dtype).
    1 to `_DECODE_MAX_M` rows take the decode kernel where the plan has one: the same
    activation bytes, one launch, its own summation order (docs/numerics.md §7)."""
    if (
        type(x) is not torch.Tensor
        or (bias is not None and not (plan.epilogue_bias and bias.dtype == x.dtype))
        or (
            torch.is_grad_enabled()
            and (x.requires_grad or (bias is not None and bias.requires_grad))
        )
        or torch.is_autocast_enabled(x.device.type)
        or _cast_kernels.current_mode() == "torch"
        or torch.compiler.is_compiling()
    ):
        return None
    from lowp_torch import _triton_casts  # imported by the general path's first call

    k = x.shape[-1]
    rows = x.reshape(-1, k) if x.dim() != 2 else x
    rows = rows.contiguous()
    if plan.decode is not None and 0 < rows.shape[0] <= _DECODE_MAX_M:
        return plan.decode(
            rows, plan.decode_codes, plan.decode_scale, bias, (*x.shape[:-1], plan.decode.n)
        )
    with _triton_casts._on_device(rows):
        codes, scale = _triton_casts._launch(rows, tuple(rows.shape), plan.scheme, plan.fmt)
    if plan.form == "rowwise":
        scale = scale.unsqueeze(-1)  # (M, 1)
    y = torch._scaled_mm(
        _storage.as_stored(codes, _storage.CODE_DTYPES[plan.fmt.name]),
        plan.b_codes_t,
        scale_a=scale,
        scale_b=plan.b_scale,
        bias=bias,
        out_dtype=x.dtype,
        use_fast_accum=plan.fast_accum,
    )
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


def _compiled_decode(x, w, bias, config):
    """A traced call of at most `_DECODE_MAX_M` rows as the `lowp::decode_linear` op
    (`_decode_op`), where the eager planned call would take the decode kernel; else
    None. The op launches the same kernel, so compiled decode is eager's. x here is
    what torch.compile traces the weight's dispatch with (fake or functional tensors),
    so it is checked by its dtype and device, not its type."""
    scheme = config.activation
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    interpreted = _cast_kernels._interpreting()  # CPU tensors too, under the interpreter
    if (
        not isinstance(m, int)  # a symbolic row count: the general path
        or not 0 < m <= _DECODE_MAX_M
        or (x.device.type != "cuda" and not interpreted)
        or x.dtype not in _storage.HP_DTYPES
        or (bias is not None and not (x.dtype != torch.float32 and bias.dtype == x.dtype))
        or not _cast_kernels._TRITON_INSTALLED
    ):
        return None
    form = _unmixed_form(scheme, w)
    if form is None or decode_problem(w, config, form) is not None:
        return None
    rows = x.reshape(m, k)
    y = torch.ops.lowp.decode_linear(
        rows,
        _storage.as_bytes(w.codes),
        w.scale.reshape(-1),
        bias,
        _cast_ops.scheme_key(scheme),
    )
    return y.reshape(*x.shape[:-1], y.shape[-1])


def _quantized_input(x, w, bias, config):
    """The GEMM of a plain input quantized with `config.activation`."""
    k = x.shape[-1]
    rows = x.reshape(-1, k) if w.dim() == 2 else x
    a = _quantize.quantize(rows, config.activation, name=f"{config.name} input")
    return _gemm_of(a, w, bias, config, out_shape=tuple(x.shape[:-1]) + (w.shape[-2],))


def _gemm_of(a, w, bias, config, out_shape=None):
    """scaled_matmul of a quantized input `a` and weight `w`, as the config asks."""
    out_dtype = a.hp_dtype
    y = _gemm.scaled_matmul(
        a
        if w.dim() == 3 or a.dim() == 2
        else _tensor_ops.reshape(a, (-1, a.shape[-1]), op="linear"),
        w,
        out_dtype=out_dtype,
        bias=bias,
        kernel="auto" if config is None else config.kernel,
        fast_accum=False if config is None else config.fast_accum,
        pad_to_16=False if config is None else config.pad_to_16,
        name="linear" if config is None else config.name,
    )
    if w.dim() == 3:
        return y
    return y.reshape(out_shape or tuple(a.shape[:-1]) + (w.shape[0],))


class _StraightThrough(torch.autograd.Function):
    """The quantized-input GEMM with the straight-through input gradient (module
    docstring): dx = dy @ dequantize(w) in x's dtype, dbias = dy summed over rows."""

    @staticmethod
    def forward(ctx, x, bias, w, config):
        ctx.w, ctx.x_dtype = w, x.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _quantized_input(x, w, bias, config)

    @staticmethod
    def backward(ctx, dy):
        w = ctx.w
        dx = db = None
        if ctx.needs_input_grad[0]:
            deq = _quantize.dequantize(w, ctx.x_dtype)
            dx = torch.matmul(dy.to(ctx.x_dtype), deq)  # (.., N) @ (N, K), or batched
        if ctx.bias_dtype is not None and ctx.needs_input_grad[1]:
            db = dy.reshape(-1, dy.shape[-1]).sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return dx, db, None, None


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """aten.mm / aten.bmm: `a @ b` with a (.., M, K), b (.., K, N), either quantized."""
    if isinstance(b, QuantizedTensor):
        dims = list(range(b.dim()))
        dims[-2:] = dims[-1], dims[-2]
        weight = _tensor_ops.permute(b, dims, op="mm")  # (.., N, K): the weight form
        if isinstance(weight, QuantizedTensor):
            return linear(a, weight, bias)
        b = weight.transpose(-1, -2)  # no quantized form: already dequantized (and logged)
    if isinstance(a, QuantizedTensor):
        a = _quantize.dequantize(a, b.dtype)
    y = torch.matmul(a, b)
    return y if bias is None else y + bias


def addmm(bias, a, b, *, beta=1, alpha=1):
    """aten.addmm: `beta * bias + alpha * (a @ b)`; the usual beta = alpha = 1 passes the
    bias to the GEMM, which adds it in high precision."""
    if beta == 1 and alpha == 1:
        return matmul(a, b, bias)
    return torch.add(bias * beta, matmul(a, b), alpha=alpha)
