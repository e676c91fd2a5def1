"""The operands of `lowp_jax.dot_general`, checked and brought to one layout: the
activation (..., K) and the weight (N, K), the contracting axis K last in both.

Quantization always runs along the contracting axis (spec §8): a high-precision operand
is quantized after this layout is made, and a QArray must already be quantized along the
axis it is contracted on. Every refusal is a ValueError naming the dim or operand.
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

import lowp
from lowp import extend
from lowp_jax import _qarray

logger = logging.getLogger("lowp_jax")


def contracting_dims(dimension_numbers, lhs_shape, rhs_shape) -> tuple[int, int]:
    try:
        (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    except (TypeError, ValueError):
        raise ValueError(
            f"dimension_numbers must be ((lhs_contracting, rhs_contracting), (lhs_batch, "
            f"rhs_batch)), got {dimension_numbers!r}"
        ) from None
    if tuple(lhs_batch) or tuple(rhs_batch):
        raise ValueError(
            f"lowp_jax.dot_general takes no batch dimensions, got lhs {tuple(lhs_batch)}, "
            f"rhs {tuple(rhs_batch)}: vmap it over the batch instead"
        )
    if len(tuple(lhs_contract)) != 1 or len(tuple(rhs_contract)) != 1:
        raise ValueError(
            f"lowp_jax.dot_general contracts exactly one dim of each operand, got lhs "
            f"{tuple(lhs_contract)}, rhs {tuple(rhs_contract)}"
        )
    if len(rhs_shape) != 2:
        raise ValueError(
            f"rhs must be a rank-2 weight, (N, K) or (K, N); got shape {tuple(rhs_shape)}"
        )
    if len(lhs_shape) < 1:
        raise ValueError("lhs must have rank >= 1, got a scalar")
    lc, rc = _dim(lhs_contract[0], lhs_shape, "lhs"), _dim(rhs_contract[0], rhs_shape, "rhs")
    if lhs_shape[lc] != rhs_shape[rc]:
        raise ValueError(
            f"contracting dims differ: lhs dim {lc} has size {lhs_shape[lc]} (shape "
            f"{tuple(lhs_shape)}), rhs dim {rc} has size {rhs_shape[rc]} (shape {tuple(rhs_shape)})"
        )
    return lc, rc


def _dim(d, shape, name) -> int:
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d < len(shape):
        raise ValueError(f"{name}: contracting dim {d!r} is out of range for shape {tuple(shape)}")
    return int(d)


def shape_of(x) -> tuple[int, ...]:
    return x.shape if isinstance(x, _qarray.QArray) else tuple(jnp.shape(x))


def hp(x, name: str):
    if not hasattr(x, "dtype") or jnp.dtype(x.dtype).name not in ("float32", "bfloat16", "float16"):
        raise TypeError(
            f"{name}: expected a QArray or a float32/bfloat16/float16 array, got "
            f"{getattr(x, 'dtype', type(x).__name__)}"
        )
    return x if isinstance(x, jax.Array) else jnp.asarray(x)


def hp_dtype(x) -> np.dtype:
    return jnp.dtype(x.hp_dtype if isinstance(x, _qarray.QArray) else x.dtype)


def scheme_for(config, role: str, shape, name: str):
    """The scheme quantizing a high-precision operand (K last), checked against its shape."""
    if config is None:
        raise TypeError(
            f"{name} is a high-precision array: pass config=lowp.InferenceConfig(...) to say "
            "how to quantize it, or pass a QArray"
        )
    scheme = getattr(config, role)
    if scheme is None:
        return None  # weight-only: the activation stays in high precision
    # (InferenceConfig keeps its schemes along axis -1: K, stored last, spec §8)
    try:
        scheme.check_shape(tuple(shape))
    except ValueError as e:
        raise ValueError(
            f"{name} ({role}, contracting axis last: shape {tuple(shape)}) cannot be quantized "
            f"with {scheme}: {e}"
        ) from None
    return scheme


def _quantized_axes(q: _qarray.QArray) -> tuple[int, ...] | None:
    """The axes q's groups run along (None: all, tensorwise)."""
    s = q.scheme
    if isinstance(s, lowp.TensorScaling):
        return None
    if isinstance(s, (lowp.BlockScaling, lowp.NVFP4TileScaling)):  # tiles of the last two
        return (q.ndim - 2, q.ndim - 1)
    return (extend.normalize_axis(s.axis, q.ndim, s),)


def check_quantized_along(q: _qarray.QArray, dim: int, name: str) -> None:
    axes = _quantized_axes(q)
    if axes is not None and dim not in axes:
        raise ValueError(
            f"{name}: QArray {q.shape} is quantized along axis {axes[0]} ({q.scheme}), but "
            f"dot_general contracts axis {dim}; quantization must run along the contracting "
            "axis (spec §8): re-quantize the high-precision tensor"
        )


def transpose(q: _qarray.QArray) -> _qarray.QArray:
    """A rank-2 QArray quantized along axis 0, as (N, K) codes quantized along axis 1."""
    s = q.scheme
    if s.fmt == "float4_e2m1fn" or isinstance(s, lowp.NVFP4Scaling):
        raise ValueError(
            f"rhs: a (K, N) float4 QArray cannot be transposed (two codes a byte along the "
            f"last axis, spec §5); quantize the (N, K) weight instead ({s})"
        )
    logger.debug(
        "dot_general: rhs QArray stored (K, N): transposing its codes at each call; "
        "store weights (N, K) as lowp_jax.quantize_params does"
    )
    if isinstance(s, lowp.TensorScaling):
        scheme, scale = s, q.scale
    elif isinstance(s, lowp.BlockScaling):
        scheme, scale = dataclasses.replace(s, block=s.block[::-1]), q.scale.T
    else:  # AxisScaling, MXScaling along axis 0
        scheme, scale = dataclasses.replace(s, axis=-1), q.with_scale_layout("plain").scale.T
    return _qarray.QArray(
        codes=q.codes.T,
        scale=scale,
        global_scale=q.global_scale,
        scheme=scheme,
        shape=q.shape[::-1],
        hp_dtype=q.hp_dtype,
    )
