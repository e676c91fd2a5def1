"""The element step's rounding (spec §4): nearest-even, or stochastic from uint32 bits.

Stochastic rounding is defined on the integer grid of the format, so every backend
that follows these lines gets the same codes from the same random bits; `random_bits`
is a counter-based hash of the flat index, so the bits themselves are portable too.
"""

import numpy as np

from lowp import _bits, _formats

ROUNDINGS = ("nearest", "stochastic")
_MASK32 = 0xFFFFFFFF


def random_bits(seed: int, shape, offset: int = 0) -> np.ndarray:
    """One uint32 per element of `shape`, a hash of its flat C-order index (spec §4).

    Args:
      seed: any int, taken mod 2**32.
      shape: the shape of the tensor *as passed* to quantize (a transposed copy gets
        other bits).
      offset: added to each index (mod 2**32), e.g. to give each step its own bits.

    >>> random_bits(0, (3,)).tolist()
    [0, 1684164658, 3653269916]
    """
    for field, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"random_bits: {field} must be an int, got {value!r}")
    dims = np.atleast_1d(shape) if np.ndim(shape) else [shape]
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in dims):
        raise ValueError(f"random_bits: shape must be non-negative ints, got {shape!r}")
    shape = tuple(int(n) for n in dims)
    count = int(np.prod(shape, dtype=np.int64))
    index = (np.arange(count, dtype=np.uint64) + np.uint64(int(offset) & _MASK32)) & np.uint64(
        _MASK32
    )
    x = index.astype(np.uint32)
    x = x * np.uint32(0x9E3779B9) + np.uint32(int(seed) & _MASK32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x21F0AAAD)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x735A2D97)
    x ^= x >> np.uint32(15)
    return x.reshape(shape)


def round_elements(v: np.ndarray, fmt: _formats.Format, random: np.ndarray | None) -> np.ndarray:
    """Codes for float32 `v`, already clamped to +-fmt.max and flushed.

    `random` is None for round-to-nearest-even, else one uint32 per element.
    """
    if random is None:
        return _formats.encode_in_range(v, fmt)
    b = _bits.bits(v)
    sign = b & _bits.SIGN
    a = _bits.from_bits(b & _bits.ABS)
    e = np.maximum(_bits.biased_exponent(b) - 127, 1 - fmt.bias)
    t = np.multiply(a, _bits.pow2(fmt.mbits - e), dtype=np.float32)  # exact
    n = np.floor(t)
    f = t - n  # exact
    fraction24 = np.floor(f * np.float32(1 << 24)).astype(np.uint32)  # exact, < 2**24
    up = (fraction24.astype(np.uint64) + (random >> np.uint32(8))) >= (1 << 24)
    q = np.multiply(n + up.astype(np.float32), _bits.pow2(e - fmt.mbits), dtype=np.float32)
    q = np.minimum(q, np.float32(fmt.max))
    return _formats.encode_in_range(_bits.from_bits(_bits.bits(q) | sign), fmt)


def random_source(rounding: str, random_bits, seed, offset_is_zero: bool, name: str) -> str:
    """Which random bits the element step uses: "none" (nearest), "seed" or "bits".

    The argument rules of spec §4, shared by every backend so they refuse the same
    calls with the same messages; each backend then checks the bits' dtype, shape and
    device itself. `offset_is_zero` is passed in because a frontend's offset may be a
    traced value.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if rounding == "nearest":
        if random_bits is not None or seed is not None or not offset_is_zero:
            raise ValueError(
                f"{name}: random_bits, seed and offset apply to rounding='stochastic' only"
            )
        return "none"
    if (random_bits is None) == (seed is None):
        raise ValueError(f"{name}: rounding='stochastic' needs exactly one of random_bits or seed")
    if seed is not None:
        return "seed"
    if not offset_is_zero:
        raise ValueError(f"{name}: offset goes with seed, not with explicit random_bits")
    return "bits"
