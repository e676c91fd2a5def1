"""Groups: the elements that share one scale, read off a scheme's `tiles` (as `lowp._groups`).

`group_max` reduces an element-shaped uint32 array to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped array back over the elements. Shapes are static.
"""

import jax.numpy as jnp

import lowp
from lowp import extend


def group_max(a: jnp.ndarray, scheme: lowp.Scheme) -> jnp.ndarray:
    """Max of `a` (uint32 |x| patterns, an exact NaN-aware key) over each group, 0 if empty."""
    shape = tuple(a.shape)
    pad, split, reduce = extend.group_reduction(shape, scheme)
    if any(pad):
        a = jnp.pad(a, [(0, after) for after in pad])
    reduced = jnp.max(a.reshape(split), axis=reduce, initial=0)
    return reduced.reshape(scheme.scale_shape(shape))


def expand(g: jnp.ndarray, scheme: lowp.Scheme, shape: tuple[int, ...]) -> jnp.ndarray:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    # Broadcasts and reshapes, not jnp.repeat: under a mesh with Explicit axes
    # (jax.make_mesh's default) repeat asks for an out_sharding, these carry the input's.
    shape = tuple(shape)
    grid, full, padded = extend.group_broadcast(shape, scheme)
    if len(full) == len(shape):  # no tiled axis: a plain broadcast
        return jnp.broadcast_to(g.reshape(grid), shape)
    out = jnp.broadcast_to(g.reshape(grid), full).reshape(padded)
    if padded != shape:  # partial edge tiles
        out = out[tuple(slice(0, n) for n in shape)]
    return out
