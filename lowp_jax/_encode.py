"""The element encoder of spec §2 and the decoders, in integer arithmetic.

A port of `lowp.encode` to uint32 JAX operations. JAX's own float6 casts are
broken (no CPU support, invalid codes on the GPU) and native float8 casts disagree on
overflow and NaN (spec §0.5), so every format goes through this one encoder. The same
routine, with float16's field widths, converts dequantized float32 values to float16.
"""

import jax.numpy as jnp
import numpy as np
from jax import lax

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


# float8 formats whose XLA convert from float32 rounds to nearest even exactly as E_fmt on
# the inputs `encode` admits: measured equal to lowp.encode on 3M values per format
# (every code, every midpoint and +-3 ulp around it, uniform and tiny magnitudes) on the
# CPU and on the H200, and by the conformance suites. Where the native casts differ from
# E_fmt (overflow, NaN; spec §0.5) the callers have already clamped and poisoned. About
# 1.5x faster than the integer encoder on an H200, where the activation cast is on every
# fp8 dense layer's critical path.
_NATIVE_FLOAT8 = {"float8_e4m3fn": jnp.float8_e4m3fn, "float8_e5m2": jnp.float8_e5m2}


def encode(b: jnp.ndarray, fmt: lowp.Format) -> jnp.ndarray:
    """E_fmt of spec §2: float32 patterns (finite, |v| <= fmt.max) -> uint8 codes."""
    native = _NATIVE_FLOAT8.get(fmt.name)
    if native is not None:
        return lax.bitcast_convert_type(_bits.from_bits(b).astype(native), jnp.uint8)
    return encode_bits(b, fmt.ebits, fmt.mbits, fmt.bias).astype(jnp.uint8)


def decode(codes: jnp.ndarray, fmt: lowp.Format) -> jnp.ndarray:
    """float32 value of each code (one code a byte), built from the code's fields.

    Integer field arithmetic rather than a table lookup: a gather of a 256-entry table
    fused behind the NVFP4 scale arithmetic sent XLA's CPU compiler into minutes of LLVM
    time under vmap (jax 0.10.2), and a gather is the slower kernel on a GPU anyway.
    """
    c = codes.astype(jnp.uint32)
    field_bits = fmt.ebits + fmt.mbits
    sign = ((c >> field_bits) & 1) << 31
    exp = ((c >> fmt.mbits) & ((1 << fmt.ebits) - 1)).astype(jnp.int32)
    mant = c & ((1 << fmt.mbits) - 1)
    normal = ((exp - fmt.bias + 127).astype(jnp.uint32) << 23) | (mant << (23 - fmt.mbits))
    # A subnormal code is mant * 2**(1 - bias - mbits), a float32 normal: shift the leading
    # one of mant into the implicit position.
    lead = 31 - lax.clz(mant).astype(jnp.int32)
    sub_exp = (lead + (1 - fmt.bias - fmt.mbits) + 127).astype(jnp.uint32) << 23
    sub_mant = (mant << (23 - lead).astype(jnp.uint32)) & _bits.MANT_MASK
    subnormal = jnp.where(mant == 0, np.uint32(0), sub_exp | sub_mant)
    b = sign | jnp.where(exp == 0, subnormal, normal)
    magnitude_code = c & ((1 << field_bits) - 1)
    for nan_code in fmt.nan_codes:
        if nan_code < (1 << field_bits):  # each NaN magnitude once; both signs match it
            b = jnp.where(magnitude_code == nan_code, _bits.NAN_BITS, b)
    if fmt.inf_code is not None:
        b = jnp.where(magnitude_code == fmt.inf_code, sign | _bits.INF_BITS, b)
    return _bits.from_bits(b)


def max_bits(fmt: lowp.Format) -> np.uint32:
    """The float32 pattern of the format's largest finite value."""
    return _bits.f32_pattern(fmt.max)
