"""Groups: the elements that share one scale, read off a scheme's `tiles`.

An axis of tile None is one group; an axis of tile b runs in groups of b consecutive
elements, the last one partial where b does not divide it (BlockScaling's edge tiles;
the other schemes' `check_shape` refuses that). `group_max` reduces an element-shaped
array to the scheme's plain scale shape; `expand` broadcasts a scale-shaped array back
over the elements.
"""

import math
from types import EllipsisType
from typing import NamedTuple

import numpy as np

from lowp import _schemes


class Reduction(NamedTuple):
    """How to reduce an element-shaped array to one value a group (`reduction`)."""

    pad: tuple  # elements appended at the end of each axis, so that its tile divides it
    split: tuple  # the padded shape, each tiled axis split into (groups, tile)
    reduce: tuple  # the axes of `split` to reduce over


class Broadcast(NamedTuple):
    """How to broadcast a scale-shaped array back over the elements (`broadcast`)."""

    grid: tuple  # the scales reshaped: a group count an axis, 1 after each tiled axis
    full: tuple  # broadcast to: each tiled axis as (groups, tile)
    padded: tuple  # merged back: each axis padded to whole tiles (then sliced to shape)


def reduction(shape: tuple, scheme: _schemes.Scheme) -> Reduction:
    """The shape arithmetic of `group_max`, for every backend. Plain Python on the
    sizes, so a frontend's symbolic sizes (torch.compile's SymInts) stay symbolic."""
    pad: list = []
    split: list = []
    reduce: list[int] = []
    for n, tile in zip(shape, scheme.tiles(len(shape)), strict=True):
        if tile is None:  # the whole axis
            reduce.append(len(split))
            split.append(n)
            pad.append(0)
        elif tile == 1:
            split.append(n)
            pad.append(0)
        else:  # groups of `tile`; zero padding is neutral for a max of non-negative keys
            groups = math.ceil(n / tile)
            reduce.append(len(split) + 1)
            split += [groups, tile]
            pad.append(groups * tile - n)
    return Reduction(tuple(pad), tuple(split), tuple(reduce))


def broadcast(shape: tuple, scheme: _schemes.Scheme) -> Broadcast:
    """The shape arithmetic of `expand`, for every backend (symbolic sizes stay so)."""
    grid: list = []
    full: list = []
    padded: list = []
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
    return Broadcast(tuple(grid), tuple(full), tuple(padded))


def group_max(a: np.ndarray, scheme: _schemes.Scheme) -> np.ndarray:
    """Max of `a` (uint32 |x| patterns) over each group, 0 for empty groups."""
    shape = a.shape
    pad, split, reduce = reduction(shape, scheme)
    if any(pad):
        a = np.pad(a, [(0, after) for after in pad])
    reduced = np.max(a.reshape(split), axis=reduce, initial=0)
    return reduced.reshape(scheme.scale_shape(shape))


def expand(g: np.ndarray, scheme: _schemes.Scheme, shape: tuple[int, ...]) -> np.ndarray:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    grid, full, padded = broadcast(shape, scheme)
    out = np.broadcast_to(np.reshape(g, grid), full)
    if len(full) == len(shape):  # no tiled axis: a plain broadcast
        return out
    out = out.reshape(padded)
    if tuple(padded) != tuple(shape):  # partial edge tiles
        out = out[tuple(slice(0, n) for n in shape)]
    return out


def multiply(x: np.ndarray, g: np.ndarray, scheme: _schemes.Scheme) -> np.ndarray:
    """float32 `x` times each element's group value `g` (plain scale shape), rounded once.

    Where the tiles divide the shape, `g` broadcasts over a split view of `x`, so the
    expanded groups are never built (`expand` copies them to merge the split axes).
    """
    grid, full, padded = broadcast(x.shape, scheme)
    if tuple(padded) != tuple(x.shape):  # partial edge tiles
        return np.multiply(x, expand(g, scheme, x.shape), dtype=np.float32)
    product = np.multiply(np.reshape(x, full), np.reshape(g, grid), dtype=np.float32)
    return product.reshape(x.shape)


def slabs(shape: tuple[int, ...], scheme: _schemes.Scheme, elements: int) -> list[tuple[int, int]]:
    """Row ranges `(start, stop)` along axis 0 of about `elements` elements each that
    cut no group: a whole number of axis-0 tiles. Where one group spans axis 0 (tile
    None), any cut does, and the caller takes the groups' amax over every slab first.
    At least one range, so that an empty input still gets its scales."""
    rows = shape[0]
    row = math.prod(shape[1:])
    tile = scheme.tiles(len(shape))[0]
    step = max(1, elements // max(row, 1))
    if tile is not None and tile > 1:
        step = max(tile, step - step % tile)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)] or [(0, 0)]


def slab_groups(start: int, stop: int, scheme: _schemes.Scheme, rank: int) -> slice | EllipsisType:
    """The scales of rows `start:stop`: a slice of the plain scale shape's axis 0, or
    all of them (`...`, which a 0-d scale takes too) where one group spans axis 0."""
    tile = scheme.tiles(rank)[0]
    if tile is None:
        return ...
    return slice(start // tile, -(-stop // tile))
