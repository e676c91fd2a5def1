"""Producer scale rules: quantize as a producer does, to the bytes it would write.

`quantize_like(x, scheme, dialect)` reproduces compressed-tensors' compressor (0.20),
step for step in the dtypes it uses (docs/checkpoints.md):

  fp8      amax per group in the model dtype hp; s = RN_hp(amax / 448), 0 -> eps(hp);
           codes = RN_e4m3(clamp(RN_hp(x / s), +-448)); s stored in hp.
  nvfp4    g = RN_hp(RN_hp(1 / max(amax, tiny(hp))) * 2688) as float32 (the encode
           global scale: torch computes `2688.0 / t` as `t.reciprocal() * 2688.0`);
           sb = RN_e4m3(clamp(RN32(g * RN_hp(block_amax / 6)), +-448)), 0 -> 0.125;
           codes = RN_e2m1(clamp(RN32(x / RN32(sb / g)), +-6)), -0 kept as code 8.

and ModelOpt's NVFP4 export (`NVFP4QTensor.quantize`, 0.47), in float32:

  nvfp4    s2 = RN32(amax / 2688) (weight_scale_2, a decode scale);
           sb = RN_e4m3(clamp(RN32(block_amax / RN32(6 * s2)) or 1 if 0, 2**-9, 448));
           codes = RN_e2m1(RN32(x / RN32(sb * s2))), ties to even, sign bit iff x < 0.

Each division rounds in float32 first, then to hp: for bfloat16 and float16 that double
rounding is innocuous (float32 has at least 2p + 2 bits), so it is the one rounding torch
does.
"""

import ml_dtypes
import numpy as np

from lowp import _bits, _formats, _groups, _layouts, _qtensor, _schemes
from lowp.checkpoints import _origin

_HP = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
_FP8_MAX, _FP4_MAX = np.float32(448), np.float32(6)
_FLOAT_SCHEMES = (
    _schemes.TensorScaling,
    _schemes.AxisScaling,
    _schemes.GroupScaling,
    _schemes.BlockScaling,
)


def quantize_like(x: np.ndarray, scheme: _schemes.Scheme, dialect: str) -> _qtensor.QTensor:
    """`x` quantized by `dialect`'s own scale rule, to the bytes it stores.

    Args:
      x: float32, bfloat16 or float16 weights (out, in), finite.
      scheme: TensorScaling, AxisScaling(axis=-1), GroupScaling(axis=-1) or
        BlockScaling of float8_e4m3fn without pow2, or NVFP4Scaling() (block 16).
      dialect: "compressed-tensors", or "modelopt" for NVFP4Scaling() only.

    Returns:
      A QTensor whose `origin` is the dialect, as `lowp.load` of the producer's file gives.
    """
    if dialect not in (_origin.COMPRESSED_TENSORS, _origin.MODELOPT):
        raise ValueError(
            f"producer scale rules: lowp reproduces {_origin.COMPRESSED_TENSORS!r} and "
            f"{_origin.MODELOPT!r} (NVFP4), not {dialect!r}"
        )
    hp_name = next(
        (name for name, dtype in _HP.items() if getattr(x, "dtype", None) == dtype), None
    )
    if hp_name is None:
        raise TypeError(
            f"quantize_like takes a float32, bfloat16 or float16 numpy array, got {getattr(x, 'dtype', type(x))}"
        )
    xf = x.astype(np.float32)
    if not np.isfinite(xf).all():
        raise ValueError(
            "quantize_like: the weights hold NaN or Inf; compressed-tensors' rule is undefined there"
        )
    scheme.check_shape(x.shape)
    nvfp4 = isinstance(scheme, _schemes.NVFP4Scaling) and scheme == _schemes.NVFP4Scaling()
    if dialect == _origin.MODELOPT:
        if not nvfp4:
            raise ValueError(f"ModelOpt: lowp reproduces its NVFP4 rule, not {scheme}")
        return _modelopt_nvfp4(xf, hp_name)
    if nvfp4:
        return _nvfp4(xf, hp_name)
    fp8 = isinstance(scheme, _FLOAT_SCHEMES) and scheme.fmt == "float8_e4m3fn" and not scheme.pow2
    if fp8 and getattr(scheme, "axis", -1) % x.ndim == x.ndim - 1:  # along `in`, as the producer
        return _fp8(xf, scheme, hp_name)
    raise ValueError(f"compressed-tensors has no rule lowp reproduces for {scheme}")


def _round(values: np.ndarray, hp_name: str) -> np.ndarray:
    """float32 values rounded once to the hp dtype, back as float32."""
    return values.astype(_HP[hp_name]).astype(np.float32)


def _fp8(xf, scheme, hp_name):
    hp = _HP[hp_name]
    amax = _amax(xf, scheme)
    scale = _round(np.divide(amax, _FP8_MAX, dtype=np.float32), hp_name)
    scale = np.where(scale == 0, np.float32(np.finfo(hp).eps), scale)
    scaled = _round(
        np.divide(xf, _groups.expand(scale, scheme, xf.shape), dtype=np.float32), hp_name
    )
    codes = np.clip(scaled, -_FP8_MAX, _FP8_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    names = ("weight", "weight_scale")
    origin = _origin.Origin(_origin.COMPRESSED_TENSORS, names, hp_name, out_dtype=hp_name)
    return _qtensor.QTensor(codes, scale, None, scheme, xf.shape, hp_name, origin=origin)


def _nvfp4(xf, hp_name):
    scheme = _schemes.NVFP4Scaling()
    tiny = np.float32(np.finfo(_HP[hp_name]).tiny)
    tensor_amax = np.maximum(np.float32(np.abs(xf).max(initial=0)), tiny)
    # `2688.0 / amax` on a tensor is torch's __rtruediv__: reciprocal, then a product
    reciprocal = _round(np.divide(np.float32(1), tensor_amax, dtype=np.float32), hp_name)
    g = _round(np.multiply(reciprocal, np.float32(2688), dtype=np.float32), hp_name).reshape(1)
    block_amax = _amax(xf, scheme)
    local = _round(np.divide(block_amax, _FP4_MAX, dtype=np.float32), hp_name)
    sb_value = np.clip(np.multiply(g, local, dtype=np.float32), -_FP8_MAX, _FP8_MAX)
    sb = sb_value.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    sb = np.where(sb == 0, np.float32(0.125), sb)
    per_block = np.divide(sb, g, dtype=np.float32)
    scaled = np.divide(xf, _groups.expand(per_block, scheme, xf.shape), dtype=np.float32)
    clipped = np.clip(scaled, -_FP4_MAX, _FP4_MAX)
    codes = _formats.encode_in_range(clipped, _formats.FLOAT4_E2M1FN)
    codes = np.where(np.signbit(clipped), codes | np.uint8(0x8), codes).astype(np.uint8)
    origin = _origin.Origin(
        _origin.COMPRESSED_TENSORS,
        ("weight_packed", "weight_scale", "weight_global_scale"),
        "float8_e4m3fn",
        out_dtype="bfloat16",
        stored_global_scale=g,
    )
    decode = np.asarray(np.divide(np.float32(1), g[0], dtype=np.float32)).reshape(())
    scale_codes = sb.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return _qtensor.QTensor(
        _layouts.pack_fp4(codes), scale_codes, decode, scheme, xf.shape, "bfloat16", origin=origin
    )


def _modelopt_nvfp4(xf, hp_name):
    scheme = _schemes.NVFP4Scaling()
    amax = np.float32(np.abs(xf).max(initial=0))
    if amax == 0:
        raise ValueError("ModelOpt's NVFP4 rule divides 0 by 0 for an all-zero tensor")
    second = np.float32(np.divide(amax, np.float32(2688), dtype=np.float32))
    six_second = np.multiply(np.float32(6), second, dtype=np.float32)
    per_block = np.divide(_amax(xf, scheme), six_second, dtype=np.float32)
    per_block = np.where(per_block == 0, np.float32(1), per_block)
    sb = np.clip(per_block, np.float32(2.0**-9), _FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    denominator = np.multiply(sb.astype(np.float32), second, dtype=np.float32)
    scaled = np.divide(xf, _groups.expand(denominator, scheme, xf.shape), dtype=np.float32)
    magnitude = _formats.encode_in_range(
        np.minimum(np.abs(scaled), _FP4_MAX), _formats.FLOAT4_E2M1FN
    )
    codes = np.where(xf < 0, magnitude | np.uint8(0x8), magnitude).astype(np.uint8)
    origin = _origin.Origin(
        _origin.MODELOPT, ("weight", "weight_scale", "weight_scale_2"), "float8_e4m3fn", hp_name
    )
    global_scale = np.asarray(second, np.float32).reshape(())
    return _qtensor.QTensor(
        _layouts.pack_fp4(codes),
        sb.view(np.uint8),
        global_scale,
        scheme,
        xf.shape,
        hp_name,
        origin=origin,
    )


def _amax(xf: np.ndarray, scheme) -> np.ndarray:
    """max |x| of each group, in the scheme's scale shape."""
    magnitude = _bits.bits(xf) & np.uint32(0x7FFFFFFF)  # group_max reduces bit patterns
    return _bits.from_bits(_groups.group_max(magnitude, scheme)).astype(np.float32)
