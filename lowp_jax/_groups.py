"""Groups: the elements that share one scale, read off a scheme's `tiles` (as `lowp._groups`).

`group_max` reduces an element-shaped uint32 array to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped array back over the elements. Shapes are static.
"""

import math

import jax.numpy as jnp

import lowp


def group_max(a: jnp.ndarray, scheme: lowp.Scheme) -> jnp.ndarray:
    """Max of `a` (uint32 |x| patterns, an exact NaN-aware key) over each group, 0 if empty."""
    shape = tuple(a.shape)
    split, reduce, pad = [], [], []
    for n, tile in zip(shape, scheme.tiles(a.ndim), strict=True):
        if tile is None:  # the whole axis
            reduce.append(len(split))
            split.append(n)
            pad.append((0, 0))
        elif tile == 1:
            split.append(n)
            pad.append((0, 0))
        else:  # groups of `tile`; zero padding is neutral for a max of non-negative keys
            groups = math.ceil(n / tile)
            reduce.append(len(split) + 1)
            split += [groups, tile]
            pad.append((0, groups * tile - n))
    if any(after for _, after in pad):
        a = jnp.pad(a, pad)
    reduced = jnp.max(a.reshape(split), axis=tuple(reduce), initial=0)
    return reduced.reshape(scheme.scale_shape(shape))


def expand(g: jnp.ndarray, scheme: lowp.Scheme, shape: tuple[int, ...]) -> jnp.ndarray:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    # Broadcasts and reshapes, not jnp.repeat: under a mesh with Explicit axes
    # (jax.make_mesh's default) repeat asks for an out_sharding, these carry the input's.
    shape = tuple(shape)
    grid, full, padded = [], [], []
    for n, tile in zip(shape, scheme.tiles(len(shape)), strict=True):
        if tile is None:
            grid.append(1)
            full.append(n)
            padded.append(n)
        elif tile == 1:
            grid.append(n)
            full.append(n)
            padded.append(n)
        else:
            groups = math.ceil(n / tile)
            grid += [groups, 1]
            full += [groups, tile]
            padded.append(groups * tile)
    if len(full) == len(shape):  # no tiled axis: a plain broadcast
        return jnp.broadcast_to(g.reshape(grid), shape)
    out = jnp.broadcast_to(g.reshape(grid), tuple(full)).reshape(padded)
    if tuple(padded) != shape:  # partial edge tiles
        out = out[tuple(slice(0, n) for n in shape)]
    return out
