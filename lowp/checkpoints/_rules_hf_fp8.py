"""Fine-grained fp8 (`quant_method: "fp8"`) scale rules: transformers' and DeepSeek's.

Both tile the weight (default 128 x 128), store float32 `weight_scale_inv` (the
*decode* multiplier) and, with `scale_fmt: "ue8m0"`, round it up to a power of two.
Their arithmetic differs, so each has its rule (float32 throughout; x is the weight as
float32, amax each tile's max |x|):

  transformers   `Fp8Quantize._quantize_one` (transformers 5.24, integrations/finegrained_fp8.py):
                 e = RN32(RN32(1 / amax) * 448) (torch's `448.0 / t` is `t.reciprocal() * 448`),
                 1 for an all-zero tile; s = RN32(1 / e);
                 ue8m0: s = 2**ceil(RN32(log2(max(s, tiny)))) stored as float8_e8m0fnu,
                 e = 1 / s; codes = RN_e4m3(clamp(RN32(x * e), +-448)).
                 A shape the tiles do not divide it leaves unquantized: lowp refuses it.
  deepseek       DeepSeek-V3 `inference/kernel.py` (`act_quant`, the block rule its
                 fp8 weights are described by; its own conversion scripts do not run here):
                 a = max(amax, RN32(1e-4)); s = RN32(a / 448);
                 ue8m0: s = 2**ceil(RN32(log2(s))) (`tl.math.log2`, `ceil`, `exp2`);
                 codes = RN_e4m3(RN32(x / s)). Partial edge tiles take their elements.

The ceiling of a float32 log2 is not the exact ceiling a few ulps above 2**k (there the
float32 log2 is k); DeepSeek-V3.2's tilelang `fast_log2_ceil` takes the exact one, so it
can differ from both rules for a scale within ~2**-21 above a power of two.
"""

import numpy as np

from lowp import _groups, _qtensor, _schemes
from lowp.checkpoints import _origin
from lowp.checkpoints._rule_steps import FP8_MAX, e4m3_codes, group_amax, pow2_ceil

TRANSFORMERS, DEEPSEEK = "transformers", "deepseek"
_NAMES = ("weight", "weight_scale_inv")


def transformers(xf: np.ndarray, scheme: _schemes.BlockScaling, hp_name: str) -> _qtensor.QTensor:
    rows, cols = xf.shape[-2:]
    if rows % scheme.block[0] or cols % scheme.block[1]:
        raise ValueError(
            f"transformers' Fp8Quantize leaves a {tuple(xf.shape)} weight unquantized: "
            f"its {scheme.block} tiles do not divide it"
        )
    amax = group_amax(xf, scheme)
    one = np.float32(1)
    with np.errstate(divide="ignore"):
        reciprocal = np.divide(one, np.where(amax > 0, amax, one), dtype=np.float32)
    encode = np.where(amax > 0, np.multiply(reciprocal, FP8_MAX, dtype=np.float32), one)
    scale = np.divide(one, encode, dtype=np.float32)
    scale_dtype = "float32"
    if scheme.pow2:
        scale = pow2_ceil(np.maximum(scale, np.finfo(np.float32).tiny))
        encode = np.divide(one, scale, dtype=np.float32)
        scale_dtype = "float8_e8m0fnu"
    product = np.multiply(xf, _groups.expand(encode, scheme, xf.shape), dtype=np.float32)
    codes = e4m3_codes(np.clip(product, -FP8_MAX, FP8_MAX))
    origin = _origin.Origin(_origin.HF_FP8, _NAMES, scale_dtype, out_dtype=hp_name)
    return _qtensor.QTensor(codes, scale, None, scheme, xf.shape, hp_name, origin=origin)


def deepseek(xf: np.ndarray, scheme: _schemes.BlockScaling, hp_name: str) -> _qtensor.QTensor:
    amax = np.maximum(group_amax(xf, scheme), np.float32(1e-4))
    scale = np.divide(amax, FP8_MAX, dtype=np.float32)
    if scheme.pow2:
        scale = pow2_ceil(scale)
    quotient = np.divide(xf, _groups.expand(scale, scheme, xf.shape), dtype=np.float32)
    origin = _origin.Origin(_origin.HF_FP8, _NAMES, "float32", out_dtype=hp_name)
    return _qtensor.QTensor(
        e4m3_codes(quotient), scale, None, scheme, xf.shape, hp_name, origin=origin
    )
