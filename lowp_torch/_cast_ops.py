"""The Triton casts as ops, for torch.compile: `lowp::triton_quantize`,
`lowp::triton_quantize_transposed` and `lowp::triton_quantize_both`, each in two forms.

A traced tensor cannot launch a kernel, and a plain call would break the graph: a
compiled graph calls these ops instead, which launch `_triton_casts`' kernels (the same
bytes; `_cast_kernels` decides when). `traced_op` picks the form:

- `lowp::<name>_inline`, a `torch.library.triton_op`, for the ops in `INLINE_NAMES`
  where Triton runs on a GPU and the input's shape is concrete: under torch.compile it
  decomposes into the kernel launches themselves (`wrap_triton`), which Inductor makes
  from its own code, so a compiled cast costs no Python op dispatch and no Python of
  `_triton_casts` at run time (an opaque op's costs more host time than its kernels
  take at a few thousand tokens). Outside a graph it launches the same kernels eagerly.
- `lowp::<name>`, an opaque custom op, launching at run time: for the other ops, a
  symbolic shape (the launch parameters are Python ints of the shape), under Triton's
  CPU interpreter (tests: `wrap_triton` cannot trace its kernels with fake tensors),
  and where triton is not installed (never launched there).

`INLINE_NAMES` holds `triton_quantize_both` alone, as measured on the H200
(docs/performance.md, "Compiled casts"): inline, float8_rowwise's compiled step halved;
with `triton_quantize` inline too, float8_tensorwise's step lost host time but gained
more device time, in Inductor's transposed copies of the codes the op makes.

Registered when `lowp_torch` is imported, so that a saved exported program loads in a
fresh process; the opaque ops' bodies import triton only when they run (registering a
triton_op reads its body's source, importing triton). A scheme travels as its `spec`
string (`scheme_key`), which the ops parse back with `lowp.extend.from_spec`.
"""

import dataclasses
import inspect
import math

import torch

from lowp import extend
from lowp_torch import _cast_kernels

NAMES = ("triton_quantize", "triton_quantize_transposed", "triton_quantize_both")
INLINE_NAMES = ("triton_quantize_both",)


def scheme_key(scheme) -> str:
    """The ops' string for a scheme: its `spec`, which `scheme_of_key` reads back."""
    return scheme.spec


def scheme_of_key(key: str):
    return extend.from_spec(key)


def traced_op(name: str, x: torch.Tensor):
    """The op a traced call of `name` (one of NAMES) on input x takes: the inline form
    where it is registered and x's shape is concrete ints, else the opaque one."""
    if INLINE and name in INLINE_NAMES and all(type(d) is int for d in x.shape):
        return getattr(torch.ops.lowp, name + "_inline")
    return getattr(torch.ops.lowp, name)


def _scale_buffer(x, scheme, shape) -> torch.Tensor:
    """An empty tensor like the flat scales the launches return for `scheme` at `shape`:
    0-d for one scale of the whole tensor, else flat; float32 or the scale bytes."""
    scale_shape = scheme.scale_shape(shape)
    dtype = torch.float32 if scheme.scale_format == "float32" else torch.uint8
    return x.new_empty((math.prod(scale_shape),) if scale_shape else (), dtype=dtype)


# --- the ops' bodies: the eager launches -----------------------------------------------


def _quantize(x: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, flat scales) of x, as `_triton_casts._launch` gives them."""
    from lowp_torch import _triton_casts  # imports triton

    s, x = scheme_of_key(scheme), x.contiguous()
    with _triton_casts._on_device(x):
        return _triton_casts._launch(x, tuple(x.shape), s, extend.element_format(s.fmt))


def _quantize_transposed(source: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes, flat scales) of source.transpose(-2, -1), as
    `_triton_casts._launch_transposed` gives them: codes (..., C, R) contiguous."""
    from lowp_torch import _triton_casts  # imports triton

    s, source = scheme_of_key(scheme), source.contiguous()
    with _triton_casts._on_device(source):
        return _triton_casts._launch_transposed(source, s, extend.element_format(s.fmt))


def _quantize_both(
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


# --- the opaque ops and their fakes (the shapes torch.compile traces with) -------------


def _quantize_fake(x, scheme):
    s = scheme_of_key(scheme)
    return torch.empty_like(x, dtype=torch.uint8), _scale_buffer(x, s, tuple(x.shape))


def _quantize_transposed_fake(source, scheme):
    s = scheme_of_key(scheme)
    shape = tuple(source.shape[:-2]) + (source.shape[-1], source.shape[-2])
    return source.new_empty(shape, dtype=torch.uint8), _scale_buffer(source, s, shape)


def _quantize_both_fake(x, scheme):
    s = scheme_of_key(scheme)
    shape = tuple(x.shape)
    along_first = dataclasses.replace(s, axis=-2)
    return (
        torch.empty_like(x, dtype=torch.uint8),
        _scale_buffer(x, s, shape),
        x.new_empty((shape[1], shape[0]), dtype=torch.uint8),
        _scale_buffer(x, along_first, shape),
    )


_BODIES = {
    "triton_quantize": (_quantize, _quantize_fake),
    "triton_quantize_transposed": (_quantize_transposed, _quantize_transposed_fake),
    "triton_quantize_both": (_quantize_both, _quantize_both_fake),
}
for _name, (_body, _fake) in _BODIES.items():
    torch.library.custom_op(f"lowp::{_name}", _body, mutates_args=()).register_fake(_fake)


# --- the inline ops: triton_ops whose bodies launch through wrap_triton ----------------


def _inline(body):
    """`body` with its launches through `wrap_triton` (`_triton_casts.wrapped_launches`):
    a triton_op's body, which torch.compile traces into the launches themselves."""

    def inline(*args):
        from lowp_torch import _triton_casts  # imports triton

        with _triton_casts.wrapped_launches():
            return body(*args)

    inline.__signature__ = inspect.signature(body)  # the op's schema
    inline.__name__ = inline.__qualname__ = body.__name__ + "_inline"
    inline.__doc__ = body.__doc__
    return inline


INLINE = _cast_kernels._TRITON_INSTALLED and not _cast_kernels._interpreting()
if INLINE:
    for _name in INLINE_NAMES:
        torch.library.triton_op(
            f"lowp::{_name}_inline", _inline(_BODIES[_name][0]), mutates_args=()
        )
