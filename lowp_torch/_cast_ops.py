"""The Triton casts as custom ops, for torch.compile: `lowp::triton_quantize`,
`lowp::triton_quantize_transposed` and `lowp::triton_quantize_both`.

A traced tensor cannot launch a kernel, and a plain call would break the graph: a
compiled graph calls these ops instead, which launch `_triton_casts`' kernels at run
time (the same bytes; `_cast_kernels` decides when). Registered when `lowp_torch` is
imported, so that a saved exported program loads in a fresh process; the op bodies
import triton only when they run. A scheme travels as its `spec` string (`scheme_key`),
which the ops parse back with `lowp.extend.from_spec`.
"""

import dataclasses
import math

import torch

from lowp import extend


def scheme_key(scheme) -> str:
    """The ops' string for a scheme: its `spec`, which `scheme_of_key` reads back."""
    return scheme.spec


def scheme_of_key(key: str):
    return extend.from_spec(key)


def _scale_buffer(x, scheme, shape) -> torch.Tensor:
    """An empty tensor like the flat scales the launches return for `scheme` at `shape`:
    0-d for one scale of the whole tensor, else flat; float32 or the scale bytes."""
    scale_shape = scheme.scale_shape(shape)
    dtype = torch.float32 if scheme.scale_format == "float32" else torch.uint8
    return x.new_empty((math.prod(scale_shape),) if scale_shape else (), dtype=dtype)


@torch.library.custom_op("lowp::triton_quantize", mutates_args=())
def _quantize_op(x: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, flat scales) of x, as `_triton_casts._launch` gives them."""
    from lowp_torch import _triton_casts  # imports triton

    s, x = scheme_of_key(scheme), x.contiguous()
    with _triton_casts._on_device(x):
        return _triton_casts._launch(x, tuple(x.shape), s, extend.element_format(s.fmt))


@_quantize_op.register_fake
def _(x, scheme):
    s = scheme_of_key(scheme)
    return torch.empty_like(x, dtype=torch.uint8), _scale_buffer(x, s, tuple(x.shape))


@torch.library.custom_op("lowp::triton_quantize_transposed", mutates_args=())
def _quantize_transposed_op(source: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, flat scales) of source.transpose(-2, -1), as
    `_triton_casts._launch_transposed` gives them: codes (..., C, R) contiguous."""
    from lowp_torch import _triton_casts  # imports triton

    s, source = scheme_of_key(scheme), source.contiguous()
    with _triton_casts._on_device(source):
        return _triton_casts._launch_transposed(source, s, extend.element_format(s.fmt))


@_quantize_transposed_op.register_fake
def _(source, scheme):
    s = scheme_of_key(scheme)
    shape = tuple(source.shape[:-2]) + (source.shape[-1], source.shape[-2])
    return source.new_empty(shape, dtype=torch.uint8), _scale_buffer(source, s, shape)


@torch.library.custom_op("lowp::triton_quantize_both", mutates_args=())
def _quantize_both_op(
    x: torch.Tensor, scheme: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row codes, row scales, column codes (C, R) and column scales of a 2-D x."""
    from lowp_torch import _triton_casts  # imports triton

    s, x = scheme_of_key(scheme), x.contiguous()
    with _triton_casts._on_device(x):
        (row_codes, row_scale), (col_codes, col_scale) = _triton_casts._launch_both(
            x, s, extend.element_format(s.fmt)
        )
    return row_codes, row_scale, col_codes, col_scale


@_quantize_both_op.register_fake
def _(x, scheme):
    s = scheme_of_key(scheme)
    shape = tuple(x.shape)
    along_first = dataclasses.replace(s, axis=-2)
    return (
        torch.empty_like(x, dtype=torch.uint8),
        _scale_buffer(x, s, shape),
        x.new_empty((shape[1], shape[0]), dtype=torch.uint8),
        _scale_buffer(x, along_first, shape),
    )
