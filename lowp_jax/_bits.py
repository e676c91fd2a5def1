"""float32 bit helpers for the JAX numerics (spec §0), all in uint32 integer arithmetic.

XLA on CPU flushes subnormal operands and results of every float operation, and XLA on
GPU keeps them; integer operations on bit patterns mean the same thing on both. So
every value that reaches a stored byte is inspected, flushed, clamped and converted
here with integer operations, and float arithmetic is kept for the few products whose
exactness the callers prove.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

# numpy uint32 scalars, not Python ints: JAX refuses Python ints above 2**31 - 1 as
# operands when x64 is off, and a uint32 scalar keeps every expression in uint32.
SIGN = np.uint32(0x80000000)
ABS = np.uint32(0x7FFFFFFF)
EXP_MASK = np.uint32(0x7F800000)
MANT_MASK = np.uint32(0x007FFFFF)
IMPLICIT = np.uint32(0x00800000)
INF_BITS = np.uint32(0x7F800000)
NAN_BITS = np.uint32(0x7FC00000)
FLT_MAX_BITS = np.uint32(0x7F7FFFFF)


def bits(x: jnp.ndarray) -> jnp.ndarray:
    """The uint32 pattern of a float32 array (a bitcast: no float operation)."""
    return lax.bitcast_convert_type(x, jnp.uint32)


def from_bits(b: jnp.ndarray) -> jnp.ndarray:
    """The float32 array whose patterns are the uint32 array `b`."""
    return lax.bitcast_convert_type(b, jnp.float32)


def ftz_bits(b: jnp.ndarray) -> jnp.ndarray:
    """Float32 patterns with subnormals replaced by the zero of their sign (spec §0.2)."""
    return jnp.where((b & EXP_MASK) == 0, b & SIGN, b)


def ftz(x: jnp.ndarray) -> jnp.ndarray:
    return from_bits(ftz_bits(bits(x)))


def biased_exponent(b: jnp.ndarray) -> jnp.ndarray:
    """E(v) of the spec, as int32, from uint32 patterns."""
    return ((b >> 23) & 0xFF).astype(jnp.int32)


def pow2(k: jnp.ndarray) -> jnp.ndarray:
    """2**k as float32 from exponent bits; k (int32) must lie in [-126, 127]."""
    return from_bits((jnp.asarray(k, jnp.int32) + 127).astype(jnp.uint32) << 23)


def mul_pow2(x: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
    """RN32(x * 2**k) for int32 k in [-253, 127] with no subnormal operand (spec §0.2).

    2**k below 2**-126 is split into two normal factors; the first product is exact
    whenever the result is normal, so the two steps round once.
    """
    k = jnp.asarray(k, jnp.int32)
    low = k < -126
    first = jnp.where(low, k + 64, k)
    second = jnp.where(low, -64, 0)
    return (x * pow2(first)) * pow2(second)


def min_bits(b: jnp.ndarray, limit: int) -> jnp.ndarray:
    """Clamp the magnitude of float32 patterns to the pattern `limit`, keeping the sign.

    Exact and NaN-proof: NaN and Inf magnitudes clamp to `limit` too (callers select
    poisoned values away before or after).
    """
    return (b & SIGN) | jnp.minimum(b & ABS, np.uint32(limit))


def is_nan_bits(b: jnp.ndarray) -> jnp.ndarray:
    return (b & ABS) > INF_BITS


def f32_pattern(value: float) -> np.uint32:
    """The uint32 pattern of a Python float rounded to float32 by NumPy (on the host)."""
    return np.float32(value).view(np.uint32)
