"""Groups: the elements that share one scale, read off a scheme's `tiles` (as `lowp._groups`).

`group_max` reduces an element-shaped int32 tensor to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped tensor back over the elements. Shapes are static
Python ints (or SymInts under torch.compile with dynamic shapes, kept symbolic), so
every branch here is decided at trace time.
"""

import torch
import torch.nn.functional as F

import lowp
from lowp import extend


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
    pad, split, reduce = extend.group_reduction(shape, scheme)
    if any(isinstance(p, torch.SymInt) or p for p in pad):
        a = F.pad(a, [p for after in reversed(pad) for p in (0, after)])
    return _amax(a.reshape(split), reduce).reshape(scheme.scale_shape(shape))


def expand(g: torch.Tensor, scheme: lowp.Scheme, shape: tuple[int, ...]) -> torch.Tensor:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    grid, full, padded = extend.group_broadcast(tuple(shape), scheme)
    out = g.reshape(grid).expand(full)
    if len(full) == len(shape):  # no tiled axis: a plain broadcast
        return out
    out = out.reshape(padded)
    if any(isinstance(p, torch.SymInt) or p != n for p, n in zip(padded, shape, strict=True)):
        out = out[tuple(slice(0, n) for n in shape)]  # partial edge tiles
    return out


def multiply(values: torch.Tensor, g: torch.Tensor, scheme: lowp.Scheme) -> torch.Tensor:
    """`values * expand(g, scheme, values.shape)`, the same products; where the tiles
    divide the shape they are taken in the grouped shape, so that the expansion is a
    broadcast instead of a copy of the whole tensor (one pass less, docs/performance.md)."""
    shape = tuple(values.shape)
    grid, full, padded = extend.group_broadcast(shape, scheme)
    whole_tiles = all(isinstance(p, int) and p == n for p, n in zip(padded, shape, strict=True))
    if len(full) == len(shape) or not whole_tiles:
        return values * expand(g, scheme, shape)
    return (values.reshape(full) * g.reshape(grid)).reshape(shape)
