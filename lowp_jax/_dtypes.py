"""Exact conversions between the high-precision dtypes and float32 patterns (spec §0.1).

Done on integer patterns rather than with `astype`: XLA on CPU treats subnormal operands
of float operations as zero, and integer code means the same thing on every backend.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

from lowp_jax import _bits, _encode

HP_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
CANONICAL_NAN_BITS = {"float32": 0x7FC00000, "bfloat16": 0x7FC0, "float16": 0x7E00}
_F16_OVERFLOW = _bits.f32_pattern(65520.0)  # half an ulp above 65504: rounds to Inf


def dtype_name(dtype) -> str | None:
    """ "float32", "bfloat16" or "float16" for those dtypes, else None."""
    name = np.dtype(dtype).name
    return name if name in HP_DTYPES else None


def to_f32_bits(x: jnp.ndarray) -> jnp.ndarray:
    """float32 patterns of a float32, bfloat16 or float16 array (every value is exact)."""
    name = dtype_name(x.dtype)
    if name == "float32":
        return _bits.bits(x)
    h = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    if name == "bfloat16":
        return h << 16
    if name == "float16":
        sign = (h >> 15) << 31
        exp = (h >> 10) & 0x1F
        mant = h & 0x3FF
        normal = ((exp + (127 - 15)) << 23) | (mant << 13)
        special = _bits.INF_BITS | (mant << 13)  # Inf and NaN (payload kept)
        # A float16 subnormal mant * 2**-24 is a float32 normal: normalise by the leading one.
        lead = 31 - lax.clz(mant)  # position of the leading one, for mant != 0
        sub_exp = (lead + (127 - 24)) << 23
        sub_mant = (mant << (23 - lead)) & _bits.MANT_MASK
        subnormal = jnp.where(mant == 0, np.uint32(0), sub_exp | sub_mant)
        magnitude = jnp.where(exp == 0x1F, special, jnp.where(exp == 0, subnormal, normal))
        return sign | magnitude
    raise TypeError(f"not a float32, bfloat16 or float16 array: {x.dtype}")


def from_f32_bits(b: jnp.ndarray, name: str) -> jnp.ndarray:
    """RN of float32 patterns to `name`, as an array of that dtype. NaN inputs give a NaN
    (callers replace it by the canonical one)."""
    if name == "float32":
        return _bits.from_bits(b)
    sign = b & _bits.SIGN
    magnitude = b & _bits.ABS
    nan = magnitude > _bits.INF_BITS
    if name == "bfloat16":
        rounded = (b + (0x7FFF + ((b >> 16) & 1))) >> 16  # ties to even; overflow gives Inf
        h = jnp.where(nan, np.uint32(0x7FC0), rounded)
    elif name == "float16":
        finite = jnp.minimum(magnitude, _F16_OVERFLOW - 1)  # keep the encoder in range
        code = _encode.encode_bits(sign | finite, 5, 10, 15)
        inf = (sign >> 16) | 0x7C00
        h = jnp.where(nan, np.uint32(0x7E00), jnp.where(magnitude >= _F16_OVERFLOW, inf, code))
    else:
        raise ValueError(f"not a high-precision dtype name: {name!r}")
    return lax.bitcast_convert_type(h.astype(jnp.uint16), HP_DTYPES[name])
