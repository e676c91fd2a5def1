"""What the dialect readers share: the reader protocol and the array conversions."""

import typing

import ml_dtypes
import numpy as np

from lowp import _qtensor, _schemes
from lowp.checkpoints import _origin

HP_DTYPES = ("float32", "bfloat16", "float16")
_FLOAT_SCALE_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(np.float16): "float16",
    np.dtype(ml_dtypes.float8_e8m0fnu): "float8_e8m0fnu",
}


class Reader(typing.Protocol):
    """One dialect's reading rules. A quantized tensor is a *primary* array (its codes)
    plus companions (its scales) that may sit in another shard."""

    dialect: str

    def primary(self, name: str, array: np.ndarray) -> str | None:
        """The logical tensor name if `name` holds a quantized tensor's codes, else None."""
        ...

    def companions(self, logical: str, primary: str) -> tuple[str, ...]:
        """The stored names `build` needs besides the primary (`primary`'s name)."""
        ...

    def build(self, logical: str, primary: str, arrays: dict[str, np.ndarray]) -> _qtensor.QTensor:
        """The QTensor of `logical` from its primary and companion arrays."""
        ...


def float_scale(name: str, array: np.ndarray) -> tuple[np.ndarray, str]:
    """float32 scales (exactly the stored values) and the stored dtype's name."""
    dtype_name = _FLOAT_SCALE_DTYPES.get(array.dtype)
    if dtype_name is None:
        raise ValueError(
            f"tensor {name!r}: a scale of dtype {array.dtype}; expected float32, bfloat16, "
            "float16 or float8_e8m0fnu"
        )
    return array.astype(np.float32), dtype_name


def expect_dtype(name: str, array: np.ndarray, dtype, what: str) -> np.ndarray:
    if array.dtype != np.dtype(dtype):
        raise ValueError(
            f"tensor {name!r}: {what} must be {np.dtype(dtype).name}, got {array.dtype}"
        )
    return array


def as_bytes(array: np.ndarray) -> np.ndarray:
    """The uint8 view of a one-byte array (float8 codes, e4m3/e8m0 scales)."""
    return array.view(np.uint8)


def scalar(name: str, array: np.ndarray) -> np.ndarray:
    """A per-tensor scale stored as shape () or (1,), as a float32 0-d array."""
    if array.size != 1:
        raise ValueError(
            f"tensor {name!r}: a per-tensor scale must hold one value, got shape {array.shape}"
        )
    return array.astype(np.float32).reshape(())


def hp_dtype_of(config: dict, default: str = "bfloat16") -> str:
    """The model's dtype from config.json ("torch_dtype", or "dtype" in transformers 5)."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value in HP_DTYPES:
            return value
    return default


def make(
    logical: str,
    *,
    codes: np.ndarray,
    scale: np.ndarray,
    global_scale: np.ndarray | None,
    scheme: _schemes.Scheme,
    shape: tuple[int, ...],
    hp_dtype: str,
    origin: _origin.Origin,
) -> _qtensor.QTensor:
    """A QTensor, or a ValueError naming the tensor and what does not fit."""
    try:
        return _qtensor.QTensor(
            codes=_contiguous(codes),
            scale=_contiguous(scale),
            global_scale=global_scale,
            scheme=scheme,
            shape=tuple(int(n) for n in shape),
            hp_dtype=hp_dtype,
            origin=origin,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{origin.dialect} tensor {logical!r} ({', '.join(origin.names)}): {e}"
        ) from e


def _contiguous(array: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return array if array.flags.c_contiguous else array.copy(order="C")
