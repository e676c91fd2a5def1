"""The element encoder of spec §2 and the decoders, in integer arithmetic.

A port of `lowp._formats.encode` to uint32 JAX operations. JAX's own float6 casts are
broken (no CPU support, invalid codes on the GPU) and native float8 casts disagree on
overflow and NaN (spec §0.5), so every format goes through this one encoder. The same
routine, with float16's field widths, converts dequantized float32 values to float16.
"""

import jax.numpy as jnp
import numpy as np

import lowp
from lowp_jax import _bits


def encode_bits(b: jnp.ndarray, ebits: int, mbits: int, bias: int) -> jnp.ndarray:
    """Round float32 patterns to the nearest code (ties to the even code), as uint32.

    `b` must be finite with a magnitude at most the format's max (callers clamp); codes
    of subnormals of the target format are produced, float32 subnormals round to a
    signed zero, and the sign bit is kept.
    """
    sign = b >> 31
    e32 = ((b >> 23) & 0xFF).astype(jnp.int32)
    mant = b & _bits.MANT_MASK
    sig = jnp.where(e32 > 0, mant | _bits.IMPLICIT, mant)  # a float32 subnormal has no implicit bit
    target = jnp.maximum(e32, 1) - 127 + bias  # biased exponent in the target format
    field = jnp.maximum(target, 1)  # subnormals share the exponent of the min normal
    # Bits of `sig` dropped: the mantissa narrowing plus the subnormal shift. A shift of 25
    # or more leaves nothing and a remainder below half, so it is capped there.
    shift = jnp.minimum(23 - mbits + (field - target), 25).astype(jnp.uint32)
    kept = sig >> shift
    rest = sig & ((np.uint32(1) << shift) - 1)
    half = np.uint32(1) << (shift - 1)
    up = (rest > half) | ((rest == half) & ((kept & 1) == 1))
    # `kept` carries the implicit bit at position mbits, so the field enters as (field - 1);
    # a mantissa carry rolls into the exponent.
    magnitude = ((field - 1).astype(jnp.uint32) << mbits) + kept + up.astype(jnp.uint32)
    return (sign << (ebits + mbits)) | magnitude


def encode(b: jnp.ndarray, fmt: lowp.Format) -> jnp.ndarray:
    """E_fmt of spec §2: float32 patterns (finite, |v| <= fmt.max) -> uint8 codes."""
    return encode_bits(b, fmt.ebits, fmt.mbits, fmt.bias).astype(jnp.uint8)


def decode(codes: jnp.ndarray, fmt: lowp.Format) -> jnp.ndarray:
    """float32 value of each code (one code a byte), looked up as bit patterns."""
    table = jnp.asarray(fmt.values().view(np.uint32))
    return _bits.from_bits(table[codes.astype(jnp.int32)])


def max_bits(fmt: lowp.Format) -> np.uint32:
    """The float32 pattern of the format's largest finite value."""
    return _bits.f32_pattern(fmt.max)
