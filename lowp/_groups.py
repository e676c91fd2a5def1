"""Groups: the elements that share one scale, read off a scheme's `tiles`.

An axis of tile None is one group; an axis of tile b runs in groups of b consecutive
elements, the last one partial where b does not divide it (BlockScaling's edge tiles;
the other schemes' `check_shape` refuses that). `group_max` reduces an element-shaped
array to the scheme's plain scale shape; `expand` broadcasts a scale-shaped array back
over the elements.
"""

import math

import numpy as np

from lowp import _schemes


def group_max(a: np.ndarray, scheme: _schemes.Scheme) -> np.ndarray:
    """Max of `a` (uint32 |x| patterns) over each group, 0 for empty groups."""
    shape = a.shape
    split: list[int] = []
    reduce: list[int] = []
    pad: list[tuple[int, int]] = []
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
        a = np.pad(a, pad)
    reduced = np.max(a.reshape(split), axis=tuple(reduce), initial=0)
    return reduced.reshape(scheme.scale_shape(shape))


def expand(g: np.ndarray, scheme: _schemes.Scheme, shape: tuple[int, ...]) -> np.ndarray:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
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
    out = np.broadcast_to(np.reshape(g, grid), full)
    if len(full) == len(shape):  # no tiled axis: a plain broadcast
        return out
    out = out.reshape(padded)
    if tuple(padded) != tuple(shape):  # partial edge tiles
        out = out[tuple(slice(0, n) for n in shape)]
    return out
