"""float32 bit helpers in torch integer ops (spec §0), mirroring `lowp._bits`.

Every value that reaches a stored byte is built from int32 views of float32: integer
operations are exact on every device and under every compiler, and immune to hardware
that flushes subnormals. The only float operations left are single products (each
rounded once) and divisions done in float64 and rounded once to float32 (`div_rn32`).

Selections on element-shaped tensors are int32 masks (-1 where a condition holds, else
0) combined with `select`, not `torch.where` on a bool tensor: on the CPU, eager
`torch.where` and comparisons that make bool tensors cost 10-30x an int32 `&` (torch
2.13, measured in docs/performance.md, CPU inference); under a compiler both fuse alike.
"""

import numpy as np
import torch

SIGN = -0x80000000  # 0x80000000 as an int32
ABS = 0x7FFFFFFF
EXP_MASK = 0x7F800000
MANT_MASK = 0x007FFFFF
MIN_NORMAL_BITS = 0x00800000  # 2**-126, the smallest normal float32
INF_BITS = 0x7F800000
NAN_F32 = 0x7FC00000
FLT_MAX = float(np.finfo(np.float32).max)
EPS_BITS = int(np.float32(1e-12).view(np.uint32))  # 0x2B8CBCCC, the float-scale amax floor


def bits(x: torch.Tensor) -> torch.Tensor:
    """The int32 pattern of a float32 tensor (a view, no copy)."""
    return x.view(torch.int32)


def from_bits(b: torch.Tensor) -> torch.Tensor:
    """The float32 tensor whose patterns are the int32 tensor `b`."""
    return b.to(torch.int32).view(torch.float32)


def biased_exponent(b: torch.Tensor) -> torch.Tensor:
    """E(v) of the spec, int32, from int32 patterns (the sign is masked off)."""
    return (b >> 23) & 0xFF


def negative_mask(v: torch.Tensor) -> torch.Tensor:
    """int32 -1 where the int32 `v` is negative, else 0 (an arithmetic shift)."""
    return v >> 31


def zero_mask(v: torch.Tensor) -> torch.Tensor:
    """int32 -1 where `v` == 0, else 0, for int32 `v` in [0, 2**31)."""
    return (v - 1) >> 31


def select(mask: torch.Tensor, a, b: torch.Tensor) -> torch.Tensor:
    """`a` where the int mask is -1, `b` where it is 0 (int tensors, or an int `a`)."""
    return b ^ ((a ^ b) & mask)


def ftz(x: torch.Tensor) -> torch.Tensor:
    """Replace float32 subnormals by zero of the same sign (spec §0.2), by a bit test:
    a magnitude below the smallest normal's is cleared, leaving the sign bit."""
    b = bits(x)
    magnitude = b & ABS
    return from_bits(b ^ (magnitude & negative_mask(magnitude - MIN_NORMAL_BITS)))


def abs_bits(x: torch.Tensor) -> torch.Tensor:
    """|x| as int32 patterns in [0, 2**31): an exact, NaN-aware key for max."""
    return bits(x) & ABS


def is_nan_bits(b: torch.Tensor) -> torch.Tensor:
    """NaN test on int32 patterns; immune to compilers that assume finite math."""
    return (b & ABS) > INF_BITS


def nan_mask(b: torch.Tensor) -> torch.Tensor:
    """`is_nan_bits` as an int32 mask: -1 where the pattern is a NaN, else 0."""
    return negative_mask(INF_BITS - (b & ABS))


def pow2(k: torch.Tensor) -> torch.Tensor:
    """2**k as float32 from exponent bits; k (an int tensor) must lie in [-126, 127]."""
    return from_bits((k.to(torch.int32) + 127) << 23)


def mul_pow2(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """RN32(x * 2**k) for integer k in [-253, 127] without a subnormal operand.

    As `lowp._bits.mul_pow2`: 2**k for k < -126 is itself subnormal (e8m0 byte 0 is
    2**-127), so it is applied as two normal factors, 2**(k + 64) then 2**-64.
    """
    first, second = pow2_factors(k)
    return (x * first) * second


def pow2_factors(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two normal float32 factors whose product `mul_pow2` applies: 2**k, or
    2**(k + 64) and 2**-64 for k < -126. Computed once per scale group, they broadcast
    over its elements (`x * first * second` is `mul_pow2(x, k)` to the bit)."""
    k = k.to(torch.int32)
    low = negative_mask(k + 126)  # k < -126
    return pow2(k + (low & 64)), pow2(low & -64)


def div_rn32(numerator, denominator: torch.Tensor) -> torch.Tensor:
    """RN32(numerator / denominator) saturated at FLT_MAX, on every device and compiler.

    torch.compile's float32 `/` on CUDA is Triton's approximate divide (spec §0.4), and
    Inductor turns a division by a constant into a multiplication by its reciprocal, so
    the quotient is taken in float64, where it is correctly rounded, and rounded once to
    float32; that double rounding is innocuous for `/` (53 >= 2*24 + 2). A Python-number
    numerator is made a tensor first: `number / tensor` in torch is
    `tensor.reciprocal() * number`, two roundings.

    Every quotient of spec §3 is positive and either stays below FLT_MAX or is clamped
    there by the spec (NVFP4's S_enc and 1/p), hence the saturation.

    Args:
      numerator: a float32 tensor or a Python number exact in float32.
      denominator: float32 tensor, positive.
    """
    den = denominator.to(torch.float64)
    if isinstance(numerator, torch.Tensor):
        num = numerator.to(torch.float64)
    else:
        num = torch.full_like(den, float(numerator))
    quotient = torch.div(num, den)
    # Clamping in float64 first makes min(RN32(q), FLT_MAX) == RN32(min(q, FLT_MAX))
    # without an out-of-range float64 -> float32 conversion.
    return torch.clamp(quotient, max=FLT_MAX).to(torch.float32)
