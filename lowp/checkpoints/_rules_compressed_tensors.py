"""compressed-tensors 0.20's compressor as a scale rule, step for step in its dtypes.

fp8      amax per group in the model dtype hp; s = RN_hp(amax / 448), 0 -> eps(hp);
         codes = RN_e4m3(clamp(RN_hp(x / s), +-448)); s stored in hp.
nvfp4    g = RN_hp(RN_hp(1 / max(amax, tiny(hp))) * 2688) as float32 (the encode
         global scale: torch computes `2688.0 / t` as `t.reciprocal() * 2688.0`);
         sb = RN_e4m3(clamp(RN32(g * RN_hp(block_amax / 6)), +-448)), 0 -> 0.125;
         codes = RN_e2m1(clamp(RN32(x / RN32(sb / g)), +-6)), -0 kept as code 8.
"""

import ml_dtypes
import numpy as np

from lowp import _formats, _groups, _layouts, _qtensor, _schemes
from lowp.checkpoints import _origin
from lowp.checkpoints._rule_steps import FP4_MAX, FP8_MAX, HP, e4m3_codes, group_amax, round_to


def fp8(xf: np.ndarray, scheme: _schemes.Scheme, hp_name: str) -> _qtensor.QTensor:
    amax = group_amax(xf, scheme)
    scale = round_to(np.divide(amax, FP8_MAX, dtype=np.float32), hp_name)
    scale = np.where(scale == 0, np.float32(np.finfo(HP[hp_name]).eps), scale)
    scaled = round_to(
        np.divide(xf, _groups.expand(scale, scheme, xf.shape), dtype=np.float32), hp_name
    )
    codes = e4m3_codes(np.clip(scaled, -FP8_MAX, FP8_MAX))
    names = ("weight", "weight_scale")
    origin = _origin.Origin(_origin.COMPRESSED_TENSORS, names, hp_name, out_dtype=hp_name)
    return _qtensor.QTensor(codes, scale, None, scheme, xf.shape, hp_name, origin=origin)


def nvfp4(xf: np.ndarray, hp_name: str) -> _qtensor.QTensor:
    scheme = _schemes.NVFP4Scaling()
    tiny = np.float32(np.finfo(HP[hp_name]).tiny)
    tensor_amax = np.maximum(np.float32(np.abs(xf).max(initial=0)), tiny)
    # `2688.0 / amax` on a tensor is torch's __rtruediv__: reciprocal, then a product
    reciprocal = round_to(np.divide(np.float32(1), tensor_amax, dtype=np.float32), hp_name)
    g = round_to(np.multiply(reciprocal, np.float32(2688), dtype=np.float32), hp_name).reshape(1)
    local = round_to(np.divide(group_amax(xf, scheme), FP4_MAX, dtype=np.float32), hp_name)
    sb_value = np.clip(np.multiply(g, local, dtype=np.float32), -FP8_MAX, FP8_MAX)
    sb = sb_value.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    sb = np.where(sb == 0, np.float32(0.125), sb)
    per_block = np.divide(sb, g, dtype=np.float32)
    scaled = np.divide(xf, _groups.expand(per_block, scheme, xf.shape), dtype=np.float32)
    clipped = np.clip(scaled, -FP4_MAX, FP4_MAX)
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
    return _qtensor.QTensor(
        _layouts.pack_fp4(codes),
        e4m3_codes(sb),
        decode,
        scheme,
        xf.shape,
        "bfloat16",
        origin=origin,
    )
