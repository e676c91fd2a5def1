"""Groups: the elements that share one scale, for each scheme.

`group_max` reduces an element-shaped array to the scheme's plain scale shape;
`expand` broadcasts a scale-shaped array back over the elements.
"""

import math

import numpy as np

from lowp import _schemes


def group_max(a: np.ndarray, scheme: _schemes.Scheme) -> np.ndarray:
    """Max of `a` (uint32 |x| patterns) over each group, 0 for empty groups."""
    shape = a.shape
    if isinstance(scheme, _schemes.TensorScaling):
        return np.max(a, initial=0).reshape(())
    if isinstance(scheme, _schemes.AxisScaling):
        ax = _schemes.normalize_axis(scheme.axis, a.ndim, scheme)
        return np.max(a, axis=ax, keepdims=True, initial=0)
    if isinstance(scheme, _schemes.BlockScaling):
        b0, b1 = scheme.block
        rows, cols = shape[-2:]
        tiles_r, tiles_c = math.ceil(rows / b0), math.ceil(cols / b1)
        pad = [(0, 0)] * (a.ndim - 2) + [(0, tiles_r * b0 - rows), (0, tiles_c * b1 - cols)]
        tiled = np.pad(a, pad).reshape(shape[:-2] + (tiles_r, b0, tiles_c, b1))
        return np.max(tiled, axis=(-3, -1), initial=0)
    if isinstance(scheme, (_schemes.MXScaling, _schemes.NVFP4Scaling)):
        ax = _schemes.normalize_axis(scheme.axis, a.ndim, scheme)
        split = shape[:ax] + (shape[ax] // scheme.block, scheme.block) + shape[ax + 1 :]
        return np.max(a.reshape(split), axis=ax + 1, initial=0)
    raise TypeError(f"not a lowp scheme: {scheme!r}")


def expand(g: np.ndarray, scheme: _schemes.Scheme, shape: tuple[int, ...]) -> np.ndarray:
    """Each element's group value: `g` (plain scale shape) broadcast to `shape`."""
    if isinstance(scheme, (_schemes.TensorScaling, _schemes.AxisScaling)):
        return np.broadcast_to(g, shape)
    if isinstance(scheme, _schemes.BlockScaling):
        b0, b1 = scheme.block
        full = np.repeat(np.repeat(g, b0, axis=-2), b1, axis=-1)
        return full[..., : shape[-2], : shape[-1]]
    if isinstance(scheme, (_schemes.MXScaling, _schemes.NVFP4Scaling)):
        ax = _schemes.normalize_axis(scheme.axis, len(shape), scheme)
        return np.repeat(g, scheme.block, axis=ax)
    raise TypeError(f"not a lowp scheme: {scheme!r}")
