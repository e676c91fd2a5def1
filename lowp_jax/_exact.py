"""Correctly rounded float32 division and multiplication from integer operations (spec §0.4).

JAX's float32 `/` is not correctly rounded on the GPU (30% of random quotients differ
from IEEE on an H200), and XLA rewrites a division by a constant into a multiplication
by a rounded reciprocal on every backend. Every division that reaches a stored byte
therefore goes through `div_rn`, built from 24-bit integer significands: exact by
construction, the same on CPU and GPU. Scale divisions are one per group, so the cost
is negligible.

`mul_narrow` exists for another hazard: XLA on CPU flushes a product whose 24-bit
rounding is below 2**-126, while IEEE (NumPy, GPUs) rounds it in subnormal precision,
which reaches 2**-126 itself from as low as 2**-126 - 2**-150. In that sliver the two
disagree after flushing (measured: `(1 - 2**-24) * 2**-126` is 2**-126 in NumPy and 0
in XLA on CPU). Products whose value is stored (scales, dequantized outputs) use it.

Every function returns flushed results (spec §0.2): a result below 2**-126 after IEEE
rounding is the zero of its sign.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

from lowp_jax import _bits

_DIVIDE_STEPS = 26  # 24 quotient bits plus a guard and a round bit; the remainder is the sticky bit
_DIGITS = (8, 8, 8, 1)  # the quotient bits after the leading one, a uint32 divide each


def _round_pack(sign: jnp.ndarray, sig: jnp.ndarray, exp: jnp.ndarray, sticky: jnp.ndarray):
    """Float32 patterns of sign | RN32((sig + δ) * 2**exp), flushed to zero.

    Args:
      sign: uint32, 0 or 0x80000000.
      sig: uint32 significand, nonzero.
      exp: int32, the weight of sig's lowest bit.
      sticky: bool, true when the exact value has nonzero bits below sig (0 < δ < 1).
    """
    lz = lax.clz(sig)
    n = sig << lz  # leading one at bit 31
    biased = exp - lz.astype(jnp.int32) + (31 + 127)  # biased exponent of that leading one
    sticky = sticky.astype(jnp.uint32)

    # Normal results: keep 24 bits, round on the 8 below (and the sticky bit).
    mant = n >> 8
    rest = n & np.uint32(0xFF)
    up = (rest > 0x80) | ((rest == 0x80) & ((sticky | (mant & 1)) == 1))
    mant = mant + up.astype(jnp.uint32)  # a carry out of 24 bits bumps the exponent below
    field = jnp.clip(biased, 1, 255).astype(jnp.uint32) - 1
    normal = (field << 23) + mant
    normal = jnp.where((biased >= 255) | (normal >= _bits.INF_BITS), _bits.INF_BITS, normal)

    # Results in [2**-127, 2**-126): IEEE rounds them on the subnormal grid (2**-149), where
    # only rounding up to 2**-126 survives the flush. Anything smaller flushes regardless.
    sub = n >> 9
    sub_rest = n & np.uint32(0x1FF)
    sub_up = (sub_rest > 0x100) | ((sub_rest == 0x100) & ((sticky | (sub & 1)) == 1))
    reaches_normal = (sub + sub_up.astype(jnp.uint32)) == (1 << 23)
    tiny = jnp.where((biased == 0) & reaches_normal, _bits.IMPLICIT, np.uint32(0))

    return sign | jnp.where(biased >= 1, normal, tiny)


def _unpack(b: jnp.ndarray):
    """(|bits|, biased exponent as int32, 24-bit significand) of flushed patterns."""
    a = b & _bits.ABS
    return a, (a >> 23).astype(jnp.int32), (a & _bits.MANT_MASK) | _bits.IMPLICIT


def div_rn(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """ftz(RN32(a / b)) for float32 arrays, exact on every backend (spec §0.4).

    Inputs are flushed first. IEEE special cases: x/0 = ±Inf, 0/0, Inf/Inf and NaN
    operands give NaN (0x7FC00000), Inf/x = ±Inf, x/Inf = ±0; quotients above FLT_MAX
    give ±Inf.

    >>> float(div_rn(jnp.float32(1), jnp.float32(3)))
    0.3333333432674408
    """
    ba = _bits.ftz_bits(_bits.bits(jnp.asarray(a, jnp.float32)))
    bb = _bits.ftz_bits(_bits.bits(jnp.asarray(b, jnp.float32)))
    ba, bb = jnp.broadcast_arrays(ba, bb)
    sign = (ba ^ bb) & _bits.SIGN
    abs_a, exp_a, ma = _unpack(ba)
    abs_b, exp_b, mb = _unpack(bb)

    # Make ma/mb lie in [1, 2): then the quotient's leading bit is 1, with remainder ma - mb.
    smaller = ma < mb
    ma = jnp.where(smaller, ma << 1, ma)
    exp_a = exp_a - smaller.astype(jnp.int32)
    # Long division in base 2**8 on uint32 integer divides, which are exact on every
    # backend: the remainder stays below mb < 2**24, so (r << 8) fits 32 bits.
    q = jnp.ones_like(ma)
    r = ma - mb
    for digit_bits in _DIGITS:
        t = r << digit_bits
        d = t // mb
        q = (q << digit_bits) | d
        r = t - d * mb
    quotient = _round_pack(sign, q, exp_a - exp_b - (_DIVIDE_STEPS - 1), r != 0)

    nan_a, nan_b = abs_a > _bits.INF_BITS, abs_b > _bits.INF_BITS
    inf_a, inf_b = abs_a == _bits.INF_BITS, abs_b == _bits.INF_BITS
    zero_a, zero_b = abs_a == 0, abs_b == 0
    nan = nan_a | nan_b | (inf_a & inf_b) | (zero_a & zero_b)
    out = jnp.where(inf_a | zero_b, sign | _bits.INF_BITS, quotient)
    out = jnp.where(zero_a | inf_b, sign, out)
    out = jnp.where(nan, _bits.NAN_BITS, out)
    return _bits.from_bits(out)


def pow2_floor_div(numerator: float, b: jnp.ndarray) -> jnp.ndarray:
    """2**floor(log2(RN32(numerator / b))), the power-of-two scale of spec §3.1, from
    exponent bits alone; +Inf where RN32 overflows, as `div_rn` then clearing the mantissa.

    With numerator = sn * 2**en and b = sb * 2**eb (significands in [1, 2)), the
    quotient is (sn / sb) * 2**(en - eb), and RN32 never carries it across a power of
    two: for sn >= sb, sn / sb <= sn <= 2 - 2**-23, a float32; for sn < sb,
    sn / sb <= 1 - 2**-23 / sb < 1 - 2**-24, below the midpoint under 1. So the floor
    exponent is en - eb - [sn < sb].

    Args:
      numerator: a positive float32 constant of at least 4, so that no quotient is
        subnormal (numerator / FLT_MAX >= 2**-126).
      b: float32 array, positive, normal and finite.
    """
    if not numerator >= 4 or float(np.float32(numerator)) != numerator:
        raise ValueError(f"pow2_floor_div needs a float32 numerator of at least 4, got {numerator}")
    n = _bits.f32_pattern(numerator)
    bb = _bits.bits(jnp.asarray(b, jnp.float32))
    smaller = (n & _bits.MANT_MASK) < (bb & _bits.MANT_MASK)
    field = int(n >> 23) - _bits.biased_exponent(bb) - smaller.astype(jnp.int32) + 127
    return _bits.from_bits(jnp.where(field >= 255, _bits.INF_BITS, field.astype(jnp.uint32) << 23))


def reciprocal_pow2(m: jnp.ndarray) -> jnp.ndarray:
    """ftz(1 / m) for m a positive normal power of two or +Inf, from exponent bits: the
    reciprocal 2**-k is exact, and flushes to 0 below 2**-126 (m of 2**127 and Inf)."""
    field = _bits.biased_exponent(_bits.bits(jnp.asarray(m, jnp.float32)))
    return _bits.from_bits(jnp.where(field < 254, (254 - field).astype(jnp.uint32) << 23, 0))


def mul_narrow(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """ftz(RN32(a * b)) exactly on every backend, for `a` of at most 8 significant bits.

    `a` is an element or scale value of a low-precision format (at most 4 significant
    bits), so the product of significands fits 32 bits. Zero, Inf and NaN operands take
    the hardware product, which is exact for them; NaN results are 0x7FC00000.
    """
    ba = _bits.ftz_bits(_bits.bits(jnp.asarray(a, jnp.float32)))
    bb = _bits.ftz_bits(_bits.bits(jnp.asarray(b, jnp.float32)))
    ba, bb = jnp.broadcast_arrays(ba, bb)
    sign = (ba ^ bb) & _bits.SIGN
    abs_a, exp_a, ma = _unpack(ba)
    abs_b, exp_b, mb = _unpack(bb)
    product = (ma >> 16) * mb  # < 2**8 * 2**24
    rounded = _round_pack(
        sign, product, exp_a + exp_b - (2 * 127 + 7 + 23), jnp.zeros(product.shape, bool)
    )
    special = (abs_a == 0) | (abs_b == 0) | (abs_a >= _bits.INF_BITS) | (abs_b >= _bits.INF_BITS)
    hardware = _bits.ftz_bits(_bits.bits(_bits.from_bits(ba) * _bits.from_bits(bb)))
    hardware = jnp.where(
        _bits.is_nan_bits(hardware), _bits.NAN_BITS, hardware
    )  # x86 gives 0xFFC00000
    return _bits.from_bits(jnp.where(special, hardware, rounded))
