"""float32 bit helpers shared by the reference numerics (spec §0).

Everything that reaches a stored byte goes through integer views of float32: exact,
identical on every backend, and immune to flush-to-zero hardware.
"""

import numpy as np
import numpy.typing as npt

SIGN = np.uint32(0x80000000)
ABS = np.uint32(0x7FFFFFFF)
EXP_MASK = np.uint32(0x7F800000)
MANT_MASK = np.uint32(0x007FFFFF)
INF_BITS = np.uint32(0x7F800000)
NAN_F32 = np.uint32(0x7FC00000)
FLT_MAX = np.float32(np.finfo(np.float32).max)


def bits(x: npt.ArrayLike) -> np.ndarray:
    """The uint32 pattern of a float32 array (a view, no copy)."""
    return np.asarray(x, dtype=np.float32, order="C").view(np.uint32)


def from_bits(b: npt.ArrayLike) -> np.ndarray:
    """The float32 array whose patterns are the uint32 array `b`."""
    return np.asarray(b, dtype=np.uint32, order="C").view(np.float32)


def biased_exponent(b: np.ndarray) -> np.ndarray:
    """E(v) of spec notation, as int64, from uint32 patterns."""
    return ((b >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int64)


def ftz(x: np.ndarray) -> np.ndarray:
    """Replace float32 subnormals by zero of the same sign (spec §0.2)."""
    b = bits(x)
    flushed = np.where((b & EXP_MASK) == 0, b & SIGN, b)
    return from_bits(flushed)


def pow2(k: np.ndarray) -> np.ndarray:
    """2**k as float32 from exponent bits; k must lie in [-126, 127] (normal range)."""
    k = np.asarray(k, dtype=np.int64)
    if k.size and (k.min() < -126 or k.max() > 127):
        raise AssertionError(f"pow2 exponent out of the normal range: {k.min()}..{k.max()}")
    return from_bits(((k + 127).astype(np.uint32)) << np.uint32(23))


def mul_pow2(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """RN32(x * 2**k) for integer k in [-253, 127] without a subnormal operand.

    Splits 2**k into two normal factors when k < -126 (e.g. an e8m0 byte 0 means
    2**-127, itself a subnormal, which XLA on CPU would flush). The first product
    stays exact whenever the final result is normal, so the two-step form rounds once.
    """
    k = np.asarray(k, dtype=np.int64)
    low = k < -126
    first = np.where(low, k + 64, k)
    second = np.where(low, -64, 0)
    y = np.multiply(x, pow2(first), dtype=np.float32)
    return np.multiply(y, pow2(second), dtype=np.float32)


def abs_bits(x: np.ndarray) -> np.ndarray:
    """|x| as uint32 patterns: an exact, NaN-aware key for max (NaN > Inf > finite)."""
    return bits(x) & ABS
