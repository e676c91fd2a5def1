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

Every rule has one shape, which `producer_plan` gives and every backend runs:
`RN_out(RN_mid(table[code] * m))`, with the per-group float32 multiplier m, the value
table of the element codes and the dtypes computed here, once, on scale-sized arrays.
"""

from typing import NamedTuple

import ml_dtypes
import numpy as np

from lowp import _formats, _groups, _layouts, _qtensor
from lowp.checkpoints import _origin

_OUT_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}


class ProducerPlan(NamedTuple):
    """A producer's dequantization as `RN_out(RN_mid(table[code] * multiplier))`.

    Attributes:
      table: float32 value of each element code (256 for float8, 16 for float4), with
        the producer's sign of zero.
      multiplier: float32, the plain scale shape: what each group's codes multiply by.
      mid_dtype: the dtype the product rounds to first ("float32", or the scale dtype).
      out_dtype: the dtype returned.
    """

    table: np.ndarray
    multiplier: np.ndarray
    mid_dtype: str
    out_dtype: str


def producer_plan(q: _qtensor.QTensor, out_dtype: str | None = None) -> ProducerPlan:
    """The plan of `q`'s producer's dequantization (module docstring; docs/checkpoints.md).

    Args:
      q: a QTensor read from a checkpoint dialect (its `origin` set).
      out_dtype: "float32", "bfloat16", "float16", or None for the producer's own
        output dtype (`q.origin.out_dtype`): the last rounding goes to it instead.
    """
    origin = q.origin
    if not isinstance(origin, _origin.Origin):
        raise TypeError(f"producer_plan needs a QTensor read from a checkpoint, got {q!r}")
    out_dtype = origin.out_dtype if out_dtype is None else out_dtype
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(
            f"out_dtype must be one of {tuple(_OUT_DTYPES)} or None, got {out_dtype!r}"
        )
    q = q.with_scale_layout("plain")
    fmt = _formats.element_format(q.scheme.fmt)
    table = _formats.decode(
        np.arange(2 ** (1 + fmt.ebits + fmt.mbits), dtype=np.uint8), fmt
    ).astype(np.float32)
    family, dialect, mid = q.scheme.family, origin.dialect, "float32"
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if family == "float":
            multiplier = q.scale.astype(np.float32)
            if dialect == _origin.MODELOPT:  # the scale is cast to the output dtype first
                multiplier = multiplier.astype(_OUT_DTYPES[out_dtype]).astype(np.float32)
            if dialect == _origin.COMPRESSED_TENSORS:  # the product is in the scale dtype
                mid = origin.scale_dtype
        elif family == "nvfp4":
            if dialect == _origin.MODELOPT:  # its e2m1 table reads code 8 as +0, not -0
                table = np.where(table == 0, np.float32(0), table)
            block = _formats.decode(q.scale, _formats.FLOAT8_E4M3FN)
            if dialect == _origin.COMPRESSED_TENSORS:
                encode = np.float32(np.asarray(origin.stored_global_scale).reshape(-1)[0])
                multiplier = np.divide(block, encode, dtype=np.float32)
            else:
                decode = np.float32(1) if q.global_scale is None else q.global_scale
                multiplier = np.multiply(block, decode, dtype=np.float32)
        elif family == "mx":
            # ldexp's 2**(e - 127) in float32: e = 0 is a subnormal, e = 255 is 2**128 = Inf.
            exponent = q.scale.astype(np.int32) - 127
            multiplier = np.ldexp(np.float32(1), exponent).astype(np.float32)
        else:
            raise TypeError(f"no producer dequantization for {q.scheme} from {dialect}")
    return ProducerPlan(table, np.asarray(multiplier, np.float32), mid, out_dtype)


def producer_dequantize(q: _qtensor.QTensor, out_dtype: str | None = None) -> np.ndarray:
    """The values the producer of `q`'s file dequantizes it to, bit for bit (NumPy).

    Args: as `producer_plan`.
    """
    plan = producer_plan(q, out_dtype)
    codes = _layouts.unpack_fp4(q.codes) if q.scheme.fmt == "float4_e2m1fn" else q.codes
    multiplier = _groups.expand(plan.multiplier, q.scheme, q.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        product = np.multiply(plan.table[codes], multiplier, dtype=np.float32)
        return product.astype(_OUT_DTYPES[plan.mid_dtype]).astype(_OUT_DTYPES[plan.out_dtype])


def refuse_origin(q: _qtensor.QTensor, what: str, producer_values: str) -> None:
    """ValueError where `q` was read from another tool's checkpoint (its `origin` set):
    `what` (saving it, moving it to a frontend) would drop the producer's dequantization
    rule and with it the values `lowp.dequantize(q)` gives. `producer_values` names the
    call that gives those values where `what` happens."""
    if q.origin is None:
        return
    raise ValueError(
        f"{what}: the QTensor was read from a {q.origin.dialect} checkpoint; its values are "
        "that producer's dequantization, which lowp's own arithmetic does not always give "
        "(origin would be dropped). Pass dataclasses.replace(q, origin=None) to take lowp's "
        f"arithmetic, or {producer_values} for the producer's values"
    )
