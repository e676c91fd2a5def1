"""torchao 0.18's Float8Tensor (`Float8Tensor.from_hp`, its "torch" kernel) as a scale rule.

  s = RN32(RN_hp(amax / 448))   `_choose_scale_float8`: the division keeps the weight's
                                dtype hp, then the scale is cast to float32
  codes = RN_e4m3(clamp(RN32(x / s), +-448))   `_quantize_affine_float8`, in float32

per tensor, row, group along `in` or 2-D block (`block_size`). On a GPU with MSLK's
Triton kernels, PerRow and PerTensor take `quantize_fp8_row` / `quantize_fp8_tensor`
instead (KernelPreference.AUTO), another rule this does not reproduce. An all-zero
group divides 0 by 0 (NaN codes): lowp refuses it.
"""

import numpy as np

from lowp import _groups, _qtensor, _schemes
from lowp.checkpoints import _origin
from lowp.checkpoints._rule_steps import FP8_MAX, e4m3_codes, group_amax, round_to


def float8(xf: np.ndarray, scheme: _schemes.Scheme, hp_name: str) -> _qtensor.QTensor:
    amax = group_amax(xf, scheme)
    if (amax == 0).any():
        raise ValueError("torchao's Float8Tensor rule divides 0 by 0 for an all-zero group")
    scale = np.asarray(round_to(np.divide(amax, FP8_MAX, dtype=np.float32), hp_name))
    scale = scale.reshape(amax.shape)
    quotient = np.divide(xf, _groups.expand(scale, scheme, xf.shape), dtype=np.float32)
    codes = e4m3_codes(np.clip(quotient, -FP8_MAX, FP8_MAX))
    names = ("qdata", "scale")
    origin = _origin.Origin(_origin.TORCHAO, names, "float32", out_dtype=hp_name)
    return _qtensor.QTensor(codes, scale, None, scheme, xf.shape, hp_name, origin=origin)
