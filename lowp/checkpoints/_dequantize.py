"""Each producer's own dequantization, bit for bit (docs/checkpoints.md says whose code).

Every dialect multiplies decoded element values by a scale; they differ in which dtype
each step rounds to and in the order of the steps:

  hf-fp8              RN_out(RN32(v * s))                 transformers' Fp8Dequantize,
                                                          DeepSeek-V3's weight_dequant
  compressed-tensors  fp8: RN_out(RN_sd(v * s))           `x_q.to(sd) * scale` (sd: the
                                                          stored scale dtype)
                      nvfp4: RN_out(RN32(v * RN32(sb / g)))  `scale / global_scale` first
  modelopt            fp8: RN_out(v * RN_out(s))          `q.to(out) * scale.to(out)`
                      nvfp4: RN_out(RN32(v * RN32(sb * s2))), code 8 (-0) as +0
  gpt-oss             RN_out(RN32(v * 2**(e - 127)))      ldexp; e = 255 gives Inf

RN32 is one float32 rounding, RN_x one rounding to x. Nothing is flushed to zero (the
producers run IEEE arithmetic), and a NaN or Inf scale propagates as the producer's does:
lowp's poisoned-group rule (spec §6) is lowp's own files' convention, not theirs.
"""

import ml_dtypes
import numpy as np

from lowp import _formats, _groups, _layouts, _qtensor
from lowp.checkpoints import _origin

_OUT_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}


def producer_dequantize(q: _qtensor.QTensor, out_dtype: str | None = None) -> np.ndarray:
    """The values the producer of `q`'s file dequantizes it to, bit for bit.

    Args:
      q: a QTensor read from a checkpoint dialect (its `origin` set).
      out_dtype: "float32", "bfloat16", "float16", or None for the producer's own
        output dtype (`q.origin.out_dtype`): the last rounding goes to it instead.
    """
    origin = q.origin
    if not isinstance(origin, _origin.Origin):
        raise TypeError(f"producer_dequantize needs a QTensor read from a checkpoint, got {q!r}")
    out_dtype = origin.out_dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(
            f"out_dtype must be one of {tuple(_OUT_DTYPES)} or None, got {out_dtype!r}"
        )
    out = _OUT_DTYPES[out_dtype]
    q = q.with_scale_layout("plain")
    values = _element_values(q)
    family, dialect = q.scheme.family, origin.dialect
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if family == "float":
            scale = q.scale
            if dialect == _origin.MODELOPT:  # the scale is cast to the output dtype first
                scale = scale.astype(out).astype(np.float32)
            product = np.multiply(values, _expand(scale, q), dtype=np.float32)
            if dialect == _origin.COMPRESSED_TENSORS:  # the product is in the scale dtype
                product = product.astype(_OUT_DTYPES[origin.scale_dtype])
            return product.astype(out)
        if family == "nvfp4":
            if dialect == _origin.MODELOPT:  # its e2m1 table reads code 8 as +0, not -0
                values = np.where(values == 0, np.float32(0), values)
            block = _formats.decode(q.scale, _formats.FLOAT8_E4M3FN)
            if dialect == _origin.COMPRESSED_TENSORS:
                encode = np.float32(np.asarray(origin.stored_global_scale).reshape(-1)[0])
                per_block = np.divide(block, encode, dtype=np.float32)
            else:
                decode = np.float32(1) if q.global_scale is None else q.global_scale
                per_block = np.multiply(block, decode, dtype=np.float32)
            return np.multiply(values, _expand(per_block, q), dtype=np.float32).astype(out)
        if family == "mx":
            # ldexp's 2**(e - 127) in float32: e = 0 is a subnormal, e = 255 is 2**128 = Inf.
            exponent = q.scale.astype(np.int32) - 127
            power = np.ldexp(np.float32(1), exponent).astype(np.float32)
            return np.multiply(values, _expand(power, q), dtype=np.float32).astype(out)
    raise TypeError(f"no producer dequantization for {q.scheme} from {dialect}")


def _element_values(q: _qtensor.QTensor) -> np.ndarray:
    fmt = _formats.element_format(q.scheme.fmt)
    codes = _layouts.unpack_fp4(q.codes) if fmt.name == "float4_e2m1fn" else q.codes
    return _formats.decode(codes, fmt)


def _expand(scale: np.ndarray, q: _qtensor.QTensor) -> np.ndarray:
    return _groups.expand(np.asarray(scale, np.float32), q.scheme, q.shape)
