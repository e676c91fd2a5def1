"""Stochastic rounding and its portable random bits (spec §4), in uint32 arithmetic.

`random_bits` is the counter-based hash of `lowp.random_bits`: uint32 multiplication
wraps mod 2**32 in JAX as in NumPy, so the bits are identical. `round_elements` works
on the format's integer grid with integer operations, so the codes are identical too.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

import lowp
from lowp_jax import _bits, _encode

_MASK32 = 0xFFFFFFFF


def as_uint32(value, field: str) -> jnp.ndarray:
    """A seed or offset (a Python int, or an integer scalar array, maybe traced) as a uint32
    scalar, taken mod 2**32."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"random_bits: {field} must be an int, got {value!r}")
    if isinstance(value, (int, np.integer)):
        return np.uint32(int(value) & _MASK32)
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.integer) or jnp.ndim(value) != 0:
        raise TypeError(
            f"random_bits: {field} must be an int or an integer scalar array, got {value!r}"
        )
    return jnp.asarray(value).astype(jnp.uint32)  # int32 -1 wraps to 2**32 - 1, as mod 2**32


def random_bits(seed, shape, offset=0) -> jax.Array:
    """One uint32 per element of `shape`, a hash of its flat C-order index (spec §4).

    Bit-identical to `lowp.random_bits(seed, shape, offset)`. `shape` is a tuple or, for
    one dimension, an int. `seed` and `offset` may be Python ints (any size, taken mod
    2**32) or integer scalar arrays, traced or not.

    >>> random_bits(0, (3,)).tolist()
    [0, 1684164658, 3653269916]
    """
    shape = tuple(int(n) for n in np.atleast_1d(shape)) if np.ndim(shape) else (int(shape),)
    seed = as_uint32(seed, "seed")
    offset = as_uint32(offset, "offset")
    x = jnp.arange(math.prod(shape), dtype=jnp.uint32) + offset
    x = x * np.uint32(0x9E3779B9) + seed
    x = x ^ (x >> 16)
    x = x * np.uint32(0x21F0AAAD)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x735A2D97)
    x = x ^ (x >> 15)
    return x.reshape(shape)


def round_elements(b: jnp.ndarray, fmt: lowp.Format, random: jnp.ndarray | None) -> jnp.ndarray:
    """uint8 codes for float32 patterns `b`, already clamped to +-fmt.max and flushed.

    `random` is None for round-to-nearest-even, else one uint32 per element: spec §4's
    `up = floor(f * 2**24) + (r >> 8) >= 2**24` with the fraction f read off the bits.
    """
    if random is None:
        return _encode.encode(b, fmt)
    sign = b & _bits.SIGN
    e32 = ((b >> 23) & 0xFF).astype(jnp.int32)
    sig = jnp.where(e32 > 0, (b & _bits.MANT_MASK) | _bits.IMPLICIT, np.uint32(0))
    exponent = jnp.maximum(e32 - 127, 1 - fmt.bias)  # the grid's binade, floored at min normal
    # t = |v| * 2**(mbits - exponent) = sig / 2**shift: n = floor(t), f = t - n.
    shift = (23 - fmt.mbits + exponent - (e32 - 127)).astype(jnp.uint32)  # >= 23 - mbits
    n = sig >> jnp.minimum(shift, 31)
    fraction = sig & ((np.uint32(1) << jnp.minimum(shift, 31)) - 1)
    fraction24 = jnp.where(  # floor(f * 2**24); f has `shift` bits, at least 20
        shift <= 24,
        fraction << (24 - jnp.minimum(shift, 24)),
        fraction >> jnp.minimum(shift - 24, 31),
    )
    up = (fraction24 + (random >> 8)) >= (1 << 24)  # both below 2**24: no wraparound
    steps = (n + up.astype(jnp.uint32)).astype(jnp.float32)  # at most 2**(mbits+1): exact
    q = steps * _bits.pow2(exponent - fmt.mbits)  # a point of the format's grid: exact
    q_bits = jnp.minimum(_bits.bits(q), _encode.max_bits(fmt))
    return _encode.encode(q_bits | sign, fmt)
