"""QuantizedTensor: codes and scales as torch tensors plus the scheme that made them.

For this slice a frozen dataclass; the next turns it into a torch.Tensor subclass
with the same fields, so the field names are part of the API.
"""

import dataclasses

import torch

from lowp import _qtensor, _schemes
from lowp_torch import _layouts, _storage


@dataclasses.dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """Codes and scales of a quantized tensor (spec §3, §5, §9), on one device.

    Attributes:
      codes: the element codes, shaped like the input, except float4: last dim halved.
        dtype `float8_e4m3fn` / `float8_e5m2` (fp8), `uint8` (float6, one code a byte)
        or `float4_e2m1fn_x2` (two codes a byte, element 2j in bits 3..0).
      scale: the scheme's scales: float32 decode scales (Tensor/Axis/Block scaling),
        `float8_e8m0fnu` (MX) or `float8_e4m3fn` (NVFP4 block scales); plain shape
        `scheme.scale_shape(shape)`, or the padded 2-D matrix for "cublas_blocked".
      global_scale: NVFP4's float32 per-tensor decode scale (0-d), else None.
      scheme: the lowp scheme the tensor was quantized with.
      shape: logical shape of the high-precision tensor.
      hp_dtype: torch.float32, torch.bfloat16 or torch.float16: what dequantize returns
        by default.
      scale_layout: "plain" or "cublas_blocked" (MX/NVFP4 blocked along the last axis).

    Construction checks every field against the others (shapes and dtypes only, so it
    costs no device sync).

    >>> import torch, lowp, lowp_torch
    >>> q = lowp_torch.quantize(torch.tensor([1.0, -2.0, 448.0]), lowp.TensorScaling())
    >>> q.codes.view(torch.uint8).tolist(), q.scale.item()
    ([56, 192, 126], 1.0)
    """

    codes: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None
    scheme: _schemes.Scheme
    shape: tuple[int, ...]
    hp_dtype: torch.dtype
    scale_layout: str = "plain"

    def __post_init__(self):
        _schemes.check_scheme(self.scheme)
        if not isinstance(self.shape, tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in self.shape
        ):
            raise ValueError(
                f"QuantizedTensor.shape must be a tuple of non-negative ints, got {self.shape!r}"
            )
        self.scheme.check_shape(self.shape)
        if self.hp_dtype not in _storage.HP_DTYPES:
            raise ValueError(
                f"QuantizedTensor.hp_dtype must be one of {tuple(_storage.HP_DTYPES)}, "
                f"got {self.hp_dtype!r}"
            )
        _expect_tensor(
            "codes",
            self.codes,
            _storage.CODE_DTYPES[self.scheme.fmt],
            _qtensor.codes_shape(self.scheme, self.shape),
        )
        _expect_tensor(
            "scale",
            self.scale,
            _storage.SCALE_DTYPES[_schemes.scale_format(self.scheme)],
            _qtensor.stored_scale_shape(self.scheme, self.shape, self.scale_layout),
        )
        wants_global = isinstance(self.scheme, _schemes.NVFP4Scaling) and self.scheme.global_scale
        if wants_global:
            _expect_tensor("global_scale", self.global_scale, torch.float32, ())
        elif self.global_scale is not None:
            raise ValueError(f"QuantizedTensor.global_scale must be None for {self.scheme}")
        for field in ("scale", "global_scale"):
            tensor = getattr(self, field)
            if tensor is not None and tensor.device != self.codes.device:
                raise ValueError(
                    f"QuantizedTensor.{field} is on {tensor.device}, the codes on "
                    f"{self.codes.device}; all parts must share one device"
                )

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def dequantize(self, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Shorthand for `lowp_torch.dequantize(self, out_dtype)`."""
        from lowp_torch import _quantize  # _quantize builds QuantizedTensors

        return _quantize.dequantize(self, out_dtype)

    def with_scale_layout(self, layout: str) -> "QuantizedTensor":
        """The same tensor with its scales in `layout` ("plain" or "cublas_blocked").

        The blocked layout is the padded 2-D matrix cuBLAS block-scaled GEMMs read
        (spec §5); it applies to MX and NVFP4 scales blocked along the last axis.
        """
        if layout == self.scale_layout:
            return self
        _qtensor.stored_scale_shape(self.scheme, self.shape, layout)  # validates the layout
        rows, cols = _qtensor.blocked_matrix_shape(self.scheme, self.shape)
        scale_bytes = _storage.as_bytes(self.scale)
        if layout == "cublas_blocked":
            new_bytes = _layouts.to_cublas_blocked(scale_bytes.reshape(rows, cols))
        else:
            new_bytes = _layouts.from_cublas_blocked(scale_bytes, rows, cols).reshape(
                self.scheme.scale_shape(self.shape)
            )
        scale = _storage.as_stored(new_bytes, self.scale.dtype)
        return dataclasses.replace(self, scale=scale, scale_layout=layout)

    def __repr__(self):
        return (
            f"QuantizedTensor(shape={self.shape}, hp_dtype={self.hp_dtype}, "
            f"scheme={self.scheme}, codes={self.codes.dtype}{list(self.codes.shape)}, "
            f"scale={self.scale.dtype}{list(self.scale.shape)}, "
            f"scale_layout={self.scale_layout!r}, device={self.device})"
        )


def _expect_tensor(field, value, dtype, shape) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"QuantizedTensor.{field} must be a torch.Tensor, got {type(value).__name__}"
        )
    if value.dtype != dtype:
        raise TypeError(f"QuantizedTensor.{field} must be {dtype}, got {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"QuantizedTensor.{field} must have shape {tuple(shape)}, got {tuple(value.shape)}"
        )
