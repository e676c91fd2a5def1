"""NVIDIA ModelOpt 0.47's Hugging Face export as a scale rule, in the dtypes it uses.

  fp8, per tensor       s = RN32(amax / 448), a 0-d float32 tensor (`_export_quantized_weight`);
  (quant_algo FP8)      codes = RN_e4m3(RN_hp(RN32(x / s))): `weight / s` with a 0-d
                        float32 `s` keeps the weight's dtype hp, so the quotient rounds
                        to hp before the fp8 cast (a double rounding for bf16 weights).
  fp8, per channel      s = RN32(amax_row / 448), stored (out,);
  (FP8_PER_CHANNEL_     codes = RN_e4m3(RN32(x / s[:, None])): a dimensioned float32 `s`
   PER_TOKEN)           promotes the quotient to float32, one rounding.
  nvfp4                 s2 = RN32(amax / 2688) (weight_scale_2, a decode scale);
                        sb = RN_e4m3(clamp(RN32(block_amax / RN32(6 * s2)) or 1 if 0, 2**-9, 448));
                        codes = RN_e2m1(RN32(x / RN32(sb * s2))), ties to even, sign bit iff x < 0.

ModelOpt divides by zero for an all-zero tensor (and asserts a positive per-channel
scale): lowp refuses those inputs instead of writing NaN codes.
"""

import numpy as np

from lowp import _formats, _groups, _layouts, _qtensor, _schemes
from lowp.checkpoints import _origin
from lowp.checkpoints._rule_steps import FP4_MAX, FP8_MAX, e4m3_codes, group_amax, round_to

PER_TENSOR, PER_CHANNEL = "FP8", "FP8_PER_CHANNEL_PER_TOKEN"  # quant_algo of each fp8 kind


def fp8(xf: np.ndarray, scheme: _schemes.Scheme, hp_name: str) -> _qtensor.QTensor:
    amax = group_amax(xf, scheme)
    if (amax == 0).any():
        where = "tensor" if isinstance(scheme, _schemes.TensorScaling) else "row"
        raise ValueError(f"ModelOpt's FP8 rule divides by a zero scale: an all-zero {where}")
    scale = np.asarray(np.divide(amax, FP8_MAX, dtype=np.float32)).reshape(amax.shape)
    quotient = np.divide(xf, _groups.expand(scale, scheme, xf.shape), dtype=np.float32)
    if isinstance(scheme, _schemes.TensorScaling):  # the quotient keeps the weight's dtype
        quotient = round_to(quotient, hp_name)
    origin = _origin.Origin(_origin.MODELOPT, ("weight", "weight_scale"), "float32", hp_name)
    return _qtensor.QTensor(
        e4m3_codes(quotient), scale, None, scheme, xf.shape, hp_name, origin=origin
    )


def nvfp4(xf: np.ndarray, hp_name: str) -> _qtensor.QTensor:
    scheme = _schemes.NVFP4Scaling()
    amax = np.float32(np.abs(xf).max(initial=0))
    if amax == 0:
        raise ValueError("ModelOpt's NVFP4 rule divides 0 by 0 for an all-zero tensor")
    second = np.float32(np.divide(amax, np.float32(2688), dtype=np.float32))
    six_second = np.multiply(np.float32(6), second, dtype=np.float32)
    per_block = np.divide(group_amax(xf, scheme), six_second, dtype=np.float32)
    per_block = np.where(per_block == 0, np.float32(1), per_block)
    sb = e4m3_codes(np.clip(per_block, np.float32(2.0**-9), FP8_MAX))
    sb_value = _formats.decode(sb, _formats.FLOAT8_E4M3FN).astype(np.float32)
    denominator = np.multiply(sb_value, second, dtype=np.float32)
    scaled = np.divide(xf, _groups.expand(denominator, scheme, xf.shape), dtype=np.float32)
    magnitude = _formats.encode_in_range(
        np.minimum(np.abs(scaled), FP4_MAX), _formats.FLOAT4_E2M1FN
    )
    codes = np.where(xf < 0, magnitude | np.uint8(0x8), magnitude).astype(np.uint8)
    origin = _origin.Origin(
        _origin.MODELOPT, ("weight", "weight_scale", "weight_scale_2"), "float8_e4m3fn", hp_name
    )
    global_scale = np.asarray(second, np.float32).reshape(())
    return _qtensor.QTensor(
        _layouts.pack_fp4(codes), sb, global_scale, scheme, xf.shape, hp_name, origin=origin
    )
