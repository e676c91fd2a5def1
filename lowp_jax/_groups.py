"""Groups: the elements that share one scale, for each scheme (as `lowp._groups`).

`group_max` reduces an element-shaped uint32 array to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped array back over the elements. Shapes are static.
"""

import math

import jax.numpy as jnp

import lowp
from lowp import extend


def group_max(a: jnp.ndarray, scheme: lowp.Scheme) -> jnp.ndarray:
    """Max of `a` (uint32 |x| patterns, an exact NaN-aware key) over each group, 0 if empty."""
    shape = a.shape
    if isinstance(scheme, lowp.TensorScaling):
        return jnp.max(a, initial=0)
    if isinstance(scheme, lowp.AxisScaling):
        ax = extend.normalize_axis(scheme.axis, a.ndim, scheme)
        return jnp.max(a, axis=ax, keepdims=True, initial=0)
    if isinstance(scheme, lowp.BlockScaling):
        b0, b1 = scheme.block
        rows, cols = shape[-2:]
        tiles_r, tiles_c = math.ceil(rows / b0), math.ceil(cols / b1)
        pad = [(0, 0)] * (a.ndim - 2) + [(0, tiles_r * b0 - rows), (0, tiles_c * b1 - cols)]
        tiled = jnp.pad(a, pad).reshape(shape[:-2] + (tiles_r, b0, tiles_c, b1))
        return jnp.max(tiled, axis=(-3, -1), initial=0)
    if isinstance(scheme, (lowp.MXScaling, lowp.NVFP4Scaling)):
        ax = extend.normalize_axis(scheme.axis, a.ndim, scheme)
        split = shape[:ax] + (shape[ax] // scheme.block, scheme.block) + shape[ax + 1 :]
        return jnp.max(a.reshape(split), axis=ax + 1, initial=0)
    raise TypeError(f"not a lowp scheme: {scheme!r}")


def expand(g: jnp.ndarray, scheme: lowp.Scheme, shape: tuple[int, ...]) -> jnp.ndarray:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    if isinstance(scheme, (lowp.TensorScaling, lowp.AxisScaling)):
        return jnp.broadcast_to(g, shape)
    # Broadcasts and reshapes, not jnp.repeat: under a mesh with Explicit axes
    # (jax.make_mesh's default) repeat asks for an out_sharding, these carry the input's.
    if isinstance(scheme, lowp.BlockScaling):
        b0, b1 = scheme.block
        lead, (tiles_r, tiles_c) = g.shape[:-2], g.shape[-2:]
        tiled = jnp.broadcast_to(g[..., :, None, :, None], lead + (tiles_r, b0, tiles_c, b1))
        full = tiled.reshape(lead + (tiles_r * b0, tiles_c * b1))
        return full[..., : shape[-2], : shape[-1]]
    if isinstance(scheme, (lowp.MXScaling, lowp.NVFP4Scaling)):
        ax = extend.normalize_axis(scheme.axis, len(shape), scheme)
        split = shape[:ax] + (shape[ax] // scheme.block, scheme.block) + shape[ax + 1 :]
        return jnp.broadcast_to(jnp.expand_dims(g, ax + 1), split).reshape(shape)
    raise TypeError(f"not a lowp scheme: {scheme!r}")
