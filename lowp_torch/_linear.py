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

from lowp_torch import _gemm, _qtensor, _quantize, _tensor_ops, _weight_cache

QuantizedTensor = _qtensor.QuantizedTensor


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
        return _quantized_input(x, w, bias, config)


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
