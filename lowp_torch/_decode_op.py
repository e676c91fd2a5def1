"""The decode kernel as an op for torch.compile: `lowp::decode_linear`.

A compiled graph cannot launch `_triton_decode`'s kernel from traced tensors; it calls
this op instead. The op is a `torch.library.triton_op`: under torch.compile it
decomposes into the kernel launch itself (`Decode.traced_call`, through `wrap_triton`),
which Inductor emits in its own code, so a compiled decode call costs no Python op
dispatch; outside a compiled graph it runs the same launch eagerly. Registered when
`lowp_torch` is imported and Triton is installed (registration reads the function's
source for its kernels, importing triton); without Triton the decode path never runs.
Under Triton's CPU interpreter (tests) it is an opaque custom op instead, launching at
run time: `wrap_triton` cannot trace the interpreter's kernels with fake tensors.
The activation scheme travels as its spec string (`_cast_ops.scheme_key`).
"""

import functools

import torch

from lowp_torch import _cast_kernels, _cast_ops


def _decode_linear(
    x: torch.Tensor,
    w_codes: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: str,
) -> torch.Tensor:
    """y (M, N) of x's dtype: x (M, K) quantized with `scheme` in the kernel, times the
    uint8 e4m3 weight codes (N, K) with float32 scales (1 or N), plus bias."""
    n, k = w_codes.shape
    decode = _decode_of(n, k, x.dtype, x.device, scheme, w_scale.numel() != 1)
    return decode.traced_call(x.contiguous(), w_codes, w_scale, bias)


def _decode_linear_launched(x, w_codes, w_scale, bias, scheme: str) -> torch.Tensor:
    """`_decode_linear` as an opaque op's body: the eager `Decode` call."""
    n, k = w_codes.shape
    decode = _decode_of(n, k, x.dtype, x.device, scheme, w_scale.numel() != 1)
    return decode(x.contiguous(), w_codes, w_scale, bias)


if _cast_kernels._TRITON_INSTALLED and not _cast_kernels._interpreting():
    torch.library.triton_op("lowp::decode_linear", _decode_linear, mutates_args=())
elif _cast_kernels._TRITON_INSTALLED:
    # Triton's CPU interpreter (tests): wrap_triton cannot trace its kernels with fake
    # tensors, so the op is opaque there, launching at run time as an eager call does.
    _op = torch.library.custom_op(
        "lowp::decode_linear",
        _decode_linear_launched,
        mutates_args=(),
        schema=torch.library.infer_schema(_decode_linear, mutates_args=()),
    )
    _op.register_fake(
        lambda x, w_codes, w_scale, bias, scheme: x.new_empty((x.shape[0], w_codes.shape[0]))
    )


@functools.cache
def _decode_of(n, k, hp_dtype, device, scheme, w_rowwise):
    from lowp_torch import _triton_decode  # imports triton

    return _triton_decode.Decode(n, k, hp_dtype, device, _cast_ops.scheme_of_key(scheme), w_rowwise)
