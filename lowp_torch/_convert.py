"""Exact conversion between `lowp_torch.QuantizedTensor` and the NumPy `lowp.QTensor`.

Bytes are copied unchanged in both directions; only the dtype labels differ (lowp
keeps uint8 codes and scale codes, torch its native low-precision dtypes).
"""

import numpy as np
import torch

import lowp
from lowp import extend
from lowp_torch import _qtensor, _storage

_HP_BY_NAME = {name: dtype for dtype, name in _storage.HP_DTYPES.items()}


def to_lowp(q: _qtensor.QuantizedTensor) -> lowp.QTensor:
    """The same quantized tensor as a NumPy `lowp.QTensor` (copied to host memory).

    >>> import torch, lowp, lowp_torch
    >>> q = lowp_torch.quantize(torch.tensor([1.0, -2.0, 448.0]), lowp.TensorScaling())
    >>> lowp_torch.to_lowp(q).codes.tolist()
    [56, 192, 126]
    """
    if not isinstance(q, _qtensor.QuantizedTensor):
        raise TypeError(f"to_lowp takes a lowp_torch.QuantizedTensor, got {type(q).__name__}")
    scale = q.scale if q.scale.dtype == torch.float32 else _storage.as_bytes(q.scale)
    global_scale = None if q.global_scale is None else _host(q.global_scale)
    return lowp.QTensor(
        codes=_host(_storage.as_bytes(q.codes)),
        scale=_host(scale),
        global_scale=global_scale,
        scheme=q.scheme,
        shape=tuple(q.shape),
        hp_dtype=_storage.HP_DTYPES[q.hp_dtype],
        scale_layout=q.scale_layout,
    )


def from_lowp(qt: lowp.QTensor, device=None) -> _qtensor.QuantizedTensor:
    """A `lowp.QTensor` as a QuantizedTensor on `device` (default: the CPU), bytes unchanged.

    >>> import numpy as np, lowp, lowp_torch
    >>> qt = lowp.quantize(np.ones((1, 32), np.float32), lowp.MXScaling())
    >>> lowp_torch.from_lowp(qt).scale.dtype
    torch.float8_e8m0fnu
    """
    if not isinstance(qt, lowp.QTensor):
        raise TypeError(f"from_lowp takes a lowp.QTensor, got {type(qt).__name__}")
    extend.refuse_origin(qt, "from_lowp", "lowp_torch.dequantize_checkpoint(q)")
    fmt = qt.scheme.fmt
    codes = _storage.as_stored(_device(qt.codes, device), _storage.CODE_DTYPES[fmt])
    scale_dtype = _storage.SCALE_DTYPES[extend.scale_format(qt.scheme)]
    scale = _device(qt.scale, device)
    if scale_dtype != torch.float32:
        scale = _storage.as_stored(scale, scale_dtype)
    global_scale = None if qt.global_scale is None else _device(qt.global_scale, device)
    return _qtensor.QuantizedTensor(
        codes=codes,
        scale=scale,
        global_scale=global_scale,
        scheme=qt.scheme,
        shape=qt.shape,
        hp_dtype=_HP_BY_NAME[qt.hp_dtype],
        scale_layout=qt.scale_layout,
    )


def _host(t: torch.Tensor) -> np.ndarray:
    # A copy, so the QTensor shares no memory with the (mutable) torch storage.
    return t.detach().cpu().numpy().copy()


def _device(a: np.ndarray, device) -> torch.Tensor:
    # A copy: lowp's arrays may be read-only, and torch would alias them.
    return torch.from_numpy(np.array(a, copy=True, order="C")).to(device)
