"""Groups: the elements that share one scale, read off a scheme's `tiles` (as `lowp._groups`).

`group_max` reduces an element-shaped int32 tensor to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped tensor back over the elements. Shapes are static
Python ints (or SymInts under torch.compile with dynamic shapes, kept symbolic), so
every branch here is decided at trace time.
"""

import math

import torch
import torch.nn.functional as F

import lowp


def _amax(a: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """torch.amax over `dims`, with 0 for empty groups (torch refuses to reduce a size-0 dim)."""
    if not dims:  # every group is one element (torch.amax would reduce every dim)
        return a
    if any(a.shape[d] == 0 for d in dims):
        shape = [n for d, n in enumerate(a.shape) if d not in dims]
        return torch.zeros(shape, dtype=a.dtype, device=a.device)
    return torch.amax(a, dim=dims)


def group_max(a: torch.Tensor, scheme: lowp.Scheme) -> torch.Tensor:
    """Max of `a` (int32 |x| patterns, all >= 0) over each group, 0 for empty groups."""
    shape = tuple(a.shape)
    split, reduce, pad = [], [], []
    for n, tile in zip(shape, scheme.tiles(a.ndim), strict=True):
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
    if any(isinstance(p, torch.SymInt) or p for p in pad):
        a = F.pad(a, [p for after in reversed(pad) for p in (0, after)])
    return _amax(a.reshape(split), tuple(reduce)).reshape(scheme.scale_shape(shape))


def expand(g: torch.Tensor, scheme: lowp.Scheme, shape: tuple[int, ...]) -> torch.Tensor:
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
    out = g.reshape(grid).expand(full)
    if len(full) == len(shape):  # no tiled axis: a plain broadcast
        return out
    out = out.reshape(padded)
    if any(isinstance(p, torch.SymInt) or p != n for p, n in zip(padded, shape, strict=False)):
        out = out[tuple(slice(0, n) for n in shape)]  # partial edge tiles
    return out
