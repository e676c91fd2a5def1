"""The decode kernel as a custom op, for torch.compile: `lowp::decode_linear`.

A compiled graph cannot launch `_triton_decode`'s kernel from traced tensors; it calls
this op instead, which launches it at run time through the same `Decode` launches an
eager call takes (bound once per shape, then launched directly). Registered when
`lowp_torch` is imported (the body imports triton only when it runs); the activation
scheme travels as its spec string (`_cast_ops.scheme_key`).
"""

import functools

import torch

from lowp_torch import _cast_ops


@torch.library.custom_op("lowp::decode_linear", mutates_args=())
def _decode_linear_op(
    x: torch.Tensor,
    w_codes: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: str,
) -> torch.Tensor:
    """y (M, N) of x's dtype: x (M, K) quantized with `scheme` in the kernel, times the
    uint8 e4m3 weight codes (N, K) with float32 scales (1 or N), plus bias."""
    x = x.contiguous()
    # A Decode binds kernels compiled for its first weight's pointer alignment (Triton
    # specialises 16-byte-aligned pointers): weights of another alignment get their own.
    aligned = w_codes.data_ptr() % 16 == 0 and w_scale.data_ptr() % 16 == 0
    n, k = w_codes.shape
    decode = _decode_of(n, k, x.dtype, x.device, scheme, w_scale.numel() != 1, aligned)
    return decode(x, w_codes, w_scale, bias)


@_decode_linear_op.register_fake
def _(x, w_codes, w_scale, bias, scheme):
    return x.new_empty((x.shape[0], w_codes.shape[0]))


@functools.cache
def _decode_of(n, k, hp_dtype, device, scheme, w_rowwise, aligned):
    from lowp_torch import _triton_decode  # imports triton

    return _triton_decode.Decode(n, k, hp_dtype, device, _cast_ops.scheme_of_key(scheme), w_rowwise)
