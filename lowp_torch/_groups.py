"""Groups: the elements that share one scale, for each scheme (as `lowp._groups`).

`group_max` reduces an element-shaped int32 tensor to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped tensor back over the elements. Shapes are static
Python ints, so every branch here is decided at trace time under torch.compile.
"""

import math

import torch
import torch.nn.functional as F

import lowp
from lowp import extend


def _amax(a: torch.Tensor, dims: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """torch.amax, with 0 for empty groups (torch refuses to reduce a size-0 dim)."""
    if any(a.shape[d] == 0 for d in dims):
        shape = (
            [1 if d in dims else n for d, n in enumerate(a.shape)]
            if keepdim
            else [n for d, n in enumerate(a.shape) if d not in dims]
        )
        return torch.zeros(shape, dtype=a.dtype, device=a.device)
    return torch.amax(a, dim=dims, keepdim=keepdim)


def group_max(a: torch.Tensor, scheme: lowp.Scheme) -> torch.Tensor:
    """Max of `a` (int32 |x| patterns, all >= 0) over each group, 0 for empty groups."""
    shape = tuple(a.shape)
    if isinstance(scheme, lowp.TensorScaling):
        return _amax(a.reshape(-1), (0,), keepdim=False)
    if isinstance(scheme, lowp.AxisScaling):
        ax = extend.normalize_axis(scheme.axis, a.ndim, scheme)
        return _amax(a, (ax,), keepdim=True)
    if isinstance(scheme, lowp.BlockScaling):
        b0, b1 = scheme.block
        rows, cols = shape[-2:]
        tiles_r, tiles_c = math.ceil(rows / b0), math.ceil(cols / b1)
        # Zero padding is neutral for a max of non-negative keys.
        padded = F.pad(a, (0, tiles_c * b1 - cols, 0, tiles_r * b0 - rows))
        tiled = padded.reshape(shape[:-2] + (tiles_r, b0, tiles_c, b1))
        return _amax(tiled, (a.ndim - 2 + 1, a.ndim - 2 + 3), keepdim=False)
    if isinstance(scheme, (lowp.MXScaling, lowp.NVFP4Scaling)):
        ax = extend.normalize_axis(scheme.axis, a.ndim, scheme)
        split = shape[:ax] + (shape[ax] // scheme.block, scheme.block) + shape[ax + 1 :]
        return _amax(a.reshape(split), (ax + 1,), keepdim=False)
    raise TypeError(f"not a lowp scheme: {scheme!r}")


def expand(g: torch.Tensor, scheme: lowp.Scheme, shape: tuple[int, ...]) -> torch.Tensor:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    if isinstance(scheme, (lowp.TensorScaling, lowp.AxisScaling)):
        return g.expand(shape)
    if isinstance(scheme, lowp.BlockScaling):
        b0, b1 = scheme.block
        lead, (tiles_r, tiles_c) = tuple(g.shape[:-2]), tuple(g.shape[-2:])
        tiled = g.reshape(lead + (tiles_r, 1, tiles_c, 1)).expand(lead + (tiles_r, b0, tiles_c, b1))
        full = tiled.reshape(lead + (tiles_r * b0, tiles_c * b1))
        return full[..., : shape[-2], : shape[-1]]
    if isinstance(scheme, (lowp.MXScaling, lowp.NVFP4Scaling)):
        ax = extend.normalize_axis(scheme.axis, len(shape), scheme)
        blocks = shape[ax] // scheme.block
        split = shape[:ax] + (blocks, 1) + shape[ax + 1 :]
        full = shape[:ax] + (blocks, scheme.block) + shape[ax + 1 :]
        return g.reshape(split).expand(full).reshape(shape)
    raise TypeError(f"not a lowp scheme: {scheme!r}")
