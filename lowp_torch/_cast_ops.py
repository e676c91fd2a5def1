"""The Triton casts as ops, for torch.compile: `lowp::triton_quantize`,
`lowp::triton_quantize_transposed` and `lowp::triton_quantize_both`, opaque, and the
inline form `lowp::triton_quantize_both_inline`.

A traced tensor cannot launch a kernel, and a plain call would break the graph: a
compiled graph calls these ops instead, which launch `_triton_casts`' kernels (the same
bytes; `_cast_kernels` decides when). `traced_op` picks the form:

- `lowp::<name>_inline` for the ops of `INLINE_NAMES`, where Triton runs on a GPU: a
  `torch.library.triton_op`, which under torch.compile decomposes into the kernel
  launches themselves (`wrap_triton`), made by Inductor from its own code: a compiled
  cast costs no Python op dispatch and no Python of `_triton_casts` at run time (an
  opaque op's host time exceeds its kernels' at a few thousand tokens). With a
  symbolic shape its body calls the opaque op. Outside a graph it launches eagerly.
- `lowp::<name>`, an opaque custom op launching at run time: the other ops, Triton's
  CPU interpreter (tests: `wrap_triton` cannot trace its kernels with fake tensors),
  and a machine without triton (never launched there; the inline names are opaque ops
  there too, so that every name exists).

Why `INLINE_NAMES` holds `triton_quantize_both` alone: docs/performance.md, "Compiled
casts" (the TensorScaling cast inline slowed the transposed copies Inductor made of its
codes). The training casts, tensorwise included, go through `triton_quantize_both`,
which writes the transposed codes itself.

Registered when `lowp_torch` is imported, so that a saved exported program loads in a
fresh process; the opaque ops' bodies import triton only when they run (registering a
triton_op reads its body's source, importing triton). A scheme travels as its `spec`
string (`scheme_key`), which the ops parse back with `lowp.extend.from_spec`.
"""

import importlib
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


def traced_op(name: str):
    """The op a traced call of `name` (one of NAMES) takes: the inline form where it
    launches through Inductor (`INLINE`, and `name` in INLINE_NAMES), else the opaque
    one."""
    if INLINE and name in INLINE_NAMES:
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
    return (
        torch.empty_like(x, dtype=torch.uint8),
        _scale_buffer(x, s, shape),
        x.new_empty((shape[1], shape[0]), dtype=torch.uint8),
        _scale_buffer(x, s.permuted((1, 0)), shape),
    )


_BODIES = {
    "triton_quantize": (_quantize, _quantize_fake),
    "triton_quantize_transposed": (_quantize_transposed, _quantize_transposed_fake),
    "triton_quantize_both": (_quantize_both, _quantize_both_fake),
}
for _name, (_body, _fake) in _BODIES.items():
    torch.library.custom_op(f"lowp::{_name}", _body, mutates_args=()).register_fake(_fake)


# --- the inline ops: triton_ops whose bodies launch through wrap_triton ----------------


def _inline(name: str):
    """The inline op's body for the op `name`: its launches through `wrap_triton`
    (`_triton_casts.wrapped_launches`), which torch.compile traces into the launches
    themselves. A symbolic shape (torch.compile's dynamic shapes, torch.export's
    dims) calls the opaque op instead: the launch parameters are Python ints of the
    shape, which would pin every dim. (The choice is made here, where torch traces the
    op's body with the dims symbolic; Dynamo, which picks the op, sees them as ints.)"""
    body = _BODIES[name][0]

    def inline(*args, **kwargs):
        if not all(isinstance(d, int) for d in args[0].shape):
            return getattr(torch.ops.lowp, name)(*args, **kwargs)
        from lowp_torch import _triton_casts  # imports triton

        with _triton_casts.wrapped_launches():
            return body(*args, **kwargs)

    inline.__signature__ = inspect.signature(body)  # the op's schema
    inline.__name__ = inline.__qualname__ = body.__name__ + "_inline"
    inline.__doc__ = body.__doc__
    return inline


# The kernels each inline op launches, for torch's caches to hash (the AOTAutograd cache
# finds a triton_op's kernels in its source only when it names them in `wrap_triton`).
_INLINE_KERNELS = {
    "triton_quantize_both": (
        "tensor_amax_kernel",
        "tensor_cast_2d_kernel",
        "axis_amax_2d_kernel",
        "axis_cast_2d_kernel",
        "mx_2d_kernel",
    )
}

INLINE = _cast_kernels._TRITON_INSTALLED and not _cast_kernels._interpreting()
for _name in INLINE_NAMES:
    if INLINE:
        torch.library.triton_op(f"lowp::{_name}_inline", _inline(_name), mutates_args=())
        _kernels_of = getattr(
            importlib.import_module("torch._library.triton"), "triton_ops_to_kernels", None
        )
        if _kernels_of is not None:  # a private table of torch's: where it exists
            from lowp_torch import _triton_kernels

            _kernels_of[f"lowp::{_name}_inline"] = [
                getattr(_triton_kernels, k) for k in _INLINE_KERNELS[_name]
            ]
    else:  # the name still exists, opaque, so that a saved exported program loads
        _body, _fake = _BODIES[_name]
        _op = torch.library.custom_op(f"lowp::{_name}_inline", _body, mutates_args=())
        _op.register_fake(_fake)
