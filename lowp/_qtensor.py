"""QTensor: a quantized tensor as plain arrays plus the scheme that made it."""

import dataclasses
import math
import typing
from typing import NamedTuple, cast

import numpy as np

from lowp import _layouts, _schemes

HP_DTYPES = ("float32", "bfloat16", "float16")

# The most an empty tensor's shape may span: the product of its non-zero dims. Work and
# memory that follow a shape (scale arrays, group loops, a report's buffers) grow with
# that span though no byte backs it: a 440-byte file claiming [2**40, 0] cost days.
MAX_EMPTY_SPAN = 2**24


@dataclasses.dataclass(frozen=True, eq=False)
class QTensor:
    """Codes and scales of a quantized tensor (spec §3, §5, §9).

    Attributes:
      codes: uint8, one code a byte, except float4: two a byte along the last axis.
      scale: float32 decode scales (Tensor/Axis/Block scaling), or uint8 codes of
        float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4) block scales.
      global_scale: NVFP4's float32 per-tensor decode scale (0-d), else None.
      scheme: the scheme the tensor was quantized with.
      shape: logical shape of the high-precision tensor.
      hp_dtype: "float32", "bfloat16" or "float16": what dequantize returns by default.
      scale_layout: "plain" (the scheme's scale shape) or "cublas_blocked" (MX/NVFP4
        along the last axis: the 2-D swizzled layout of spec §5).
      origin: None, or for a tensor read from another tool's checkpoint a
        `lowp.checkpoints.Origin`: the dialect, the stored names and scale dtype, and
        the arithmetic its producer dequantizes with (which `dequantize` then follows).

    Construction checks every field against the others, so a QTensor read from a
    file is either consistent or refused.
    """

    codes: np.ndarray
    scale: np.ndarray
    global_scale: np.ndarray | None
    scheme: _schemes.Scheme
    shape: tuple[int, ...]
    hp_dtype: str
    scale_layout: str = "plain"
    origin: typing.Any = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        layout = check_layout("QTensor", self.scheme, self.shape, self.hp_dtype, self.scale_layout)
        _expect_array("codes", self.codes, np.uint8, layout.codes_shape)
        scale_dtype = np.float32 if layout.scale_format == "float32" else np.uint8
        _expect_array("scale", self.scale, scale_dtype, layout.scale_shape)
        if layout.has_global_scale:
            _expect_array("global_scale", self.global_scale, np.float32, ())
        elif self.global_scale is not None:
            raise ValueError(f"QTensor.global_scale must be None for {self.scheme}")
        _check_scale_values(self, layout)

    @property
    def poisoned(self) -> bool:
        """True if any group was poisoned by a NaN or Inf input (spec §6)."""
        from lowp import _quantize  # the dequantize rules own the meaning of a NaN scale

        return bool(_quantize.poisoned_groups(self).any())

    def dequantize(self, out_dtype: str | None = None) -> np.ndarray:
        """Shorthand for `lowp.dequantize(self, out_dtype)`."""
        from lowp import _quantize

        return _quantize.dequantize(self, out_dtype)

    def with_scale_layout(self, layout: str) -> "QTensor":
        """The same tensor with its scales in `layout` ("plain" or "cublas_blocked")."""
        if layout == self.scale_layout:
            return self
        stored_scale_shape(self.scheme, self.shape, layout)  # validates the layout applies
        rows, cols = blocked_matrix_shape(self.scheme, self.shape)
        if layout == "cublas_blocked":
            scale = _layouts.to_cublas_blocked(self.scale.reshape(rows, cols))
        else:
            scale = _layouts.from_cublas_blocked(self.scale, rows, cols).reshape(
                self.scheme.scale_shape(self.shape)
            )
        return dataclasses.replace(self, scale=scale, scale_layout=layout)

    @property
    def nbytes(self) -> int:
        """The bytes stored: codes, scales and the global scale, if any."""
        extra = 0 if self.global_scale is None else self.global_scale.nbytes
        return self.codes.nbytes + self.scale.nbytes + extra

    def __repr__(self):
        return (
            f"QTensor(shape={self.shape}, hp_dtype={self.hp_dtype!r}, scheme={self.scheme}, "
            f"codes={self.codes.dtype}{list(self.codes.shape)}, "
            f"scale={self.scale.dtype}{list(self.scale.shape)}, scale_layout={self.scale_layout!r})"
        )


def _check_scale_values(q: "QTensor", layout: "StoredLayout") -> None:
    """Scales `quantize` can write (a file from elsewhere may hold others): a float32
    scale is NaN (a poisoned group) or positive and finite, an NVFP4 block-scale code
    has its sign bit clear or is e4m3's NaN, a global scale is NaN or finite and >= 0.
    A negative or infinite scale would flip or blow up values silently."""
    if layout.scale_format == "float32":
        bad = ~(np.isnan(q.scale) | ((q.scale > 0) & np.isfinite(q.scale)))
        if bad.any():
            value = q.scale.reshape(-1)[np.argmax(bad.reshape(-1))]
            raise ValueError(
                f"QTensor.scale holds {value!r}: a scale is NaN or positive and finite"
            )
    elif layout.scale_format == "float8_e4m3fn":
        bad = (q.scale & 0x80).astype(bool) & (q.scale != 0xFF)
        if bad.any():
            code = int(q.scale.reshape(-1)[np.argmax(bad.reshape(-1))])
            raise ValueError(f"QTensor.scale holds the negative e4m3 block-scale code {code:#04x}")
    if layout.has_global_scale:
        g = cast(np.ndarray, q.global_scale)  # not None: __post_init__ checked it
        if not (np.isnan(g) or (np.isfinite(g) and g >= 0)):
            raise ValueError(f"QTensor.global_scale is {g!r}: NaN or finite and >= 0")


class StoredLayout(NamedTuple):
    """What a quantized tensor's arrays must look like, whatever the framework."""

    codes_shape: tuple[int, ...]
    scale_shape: tuple[int, ...]
    scale_format: str  # "float32", "float8_e8m0fnu" or "float8_e4m3fn"
    has_global_scale: bool


def check_layout(owner: str, scheme, shape, hp_dtype, scale_layout) -> StoredLayout:
    """Validate a quantized tensor's metadata and give the shapes its arrays must have.

    Shared by lowp.QTensor and the frontends' quantized types, so every backend refuses
    the same inconsistent tensors with the same messages (`owner` names the type).
    """
    _schemes.check_scheme(scheme)
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ValueError(f"{owner}.shape must be a tuple of non-negative ints, got {shape!r}")
    if (problem := empty_span_problem(shape)) is not None:
        raise ValueError(f"{owner}.{problem}")
    scheme.check_shape(shape)
    if hp_dtype not in HP_DTYPES:
        raise ValueError(f"{owner}.hp_dtype must be one of {HP_DTYPES}, got {hp_dtype!r}")
    return StoredLayout(
        codes_shape=codes_shape(scheme, shape),
        scale_shape=stored_scale_shape(scheme, shape, scale_layout),
        scale_format=scheme.scale_format,
        has_global_scale=scheme.family == "nvfp4" and scheme.global_scale,
    )


def empty_span(shape) -> int:
    """The product of the non-zero dims of an empty shape (0 for a non-empty one)."""
    if 0 not in shape:
        return 0
    return math.prod(n for n in shape if n)


def empty_span_problem(shape) -> str | None:
    """Why `shape` claims more than lowp lets an empty tensor claim, or None."""
    span = empty_span(shape)
    if span <= MAX_EMPTY_SPAN:
        return None
    return (
        f"shape {shape} holds no elements but spans {span} along its other dims, over the "
        f"{MAX_EMPTY_SPAN} an empty tensor may (a corrupt or hostile shape?)"
    )


def codes_shape(scheme: _schemes.Scheme, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Shape of the stored codes: the logical shape, last dim halved for float4."""
    if scheme.fmt == "float4_e2m1fn":
        return shape[:-1] + (shape[-1] // 2,)
    return shape


def stored_scale_shape(
    scheme: _schemes.Scheme, shape: tuple[int, ...], layout: str
) -> tuple[int, ...]:
    """Shape of the stored scales in `layout` (validating that the layout applies)."""
    if layout == "plain":
        return scheme.scale_shape(shape)
    if layout == "cublas_blocked":
        rows, cols = blocked_matrix_shape(scheme, shape)
        return _layouts.cublas_blocked_shape(rows, cols)
    raise ValueError(f"unknown scale layout {layout!r}; expected one of {_layouts.SCALE_LAYOUTS}")


def blocked_matrix_shape(scheme: _schemes.Scheme, shape: tuple[int, ...]) -> tuple[int, int]:
    """The scales of an MX/NVFP4 tensor blocked along its last axis, seen as a matrix."""
    if scheme.family not in ("mx", "nvfp4") or not hasattr(scheme, "axis"):
        raise ValueError(
            f"the cublas_blocked layout is for MX and NVFP4 scales along one axis, not {scheme}"
        )
    # MX and NVFP4 schemes block one axis: `axis` and an int `block`.
    blocked = typing.cast(_schemes.MXScaling | _schemes.NVFP4Scaling, scheme)
    if _schemes.normalize_axis(blocked.axis, len(shape), scheme) != len(shape) - 1:
        raise ValueError(
            f"the cublas_blocked layout needs the blocks along the last axis ({scheme})"
        )
    return math.prod(shape[:-1]), shape[-1] // blocked.block


def _expect_array(field, value, dtype, shape) -> None:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"QTensor.{field} must be a numpy array, got {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"QTensor.{field} must be {np.dtype(dtype).name}, got {value.dtype}")
    if value.shape != tuple(shape):
        raise ValueError(f"QTensor.{field} must have shape {tuple(shape)}, got {value.shape}")
