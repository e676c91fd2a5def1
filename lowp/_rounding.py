"""The element step's rounding (spec §4): nearest-even, or stochastic from uint32 bits.

Stochastic rounding is defined on the integer grid of the format, so every backend
that follows these lines gets the same codes from the same random bits; `random_bits`
is a counter-based hash of the flat index, so the bits themselves are portable too.
"""

import ml_dtypes
import numpy as np

from lowp import _bits, _formats

ROUNDINGS = ("nearest", "stochastic")
_MASK32 = 0xFFFFFFFF
_ML_DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in _formats.ELEMENT_FORMATS}


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
    check_seed(seed, offset)
    dims = np.atleast_1d(shape) if np.ndim(shape) else [shape]
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in dims):
        raise ValueError(f"random_bits: shape must be non-negative ints, got {shape!r}")
    shape = tuple(int(n) for n in dims)
    return random_bits_from(int(seed), int(offset), int(np.prod(shape, dtype=np.int64))).reshape(
        shape
    )


def check_seed(seed, offset) -> None:
    """TypeError naming a seed or offset that is not an int."""
    for field, value in (("seed", seed), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"random_bits: {field} must be an int, got {value!r}")


def random_bits_from(seed: int, first: int, count: int) -> np.ndarray:
    """The bits of flat indices `first` .. `first + count - 1` (each taken mod 2**32): a
    slice of `random_bits`, so a tensor quantized a slab at a time draws the same bits."""
    x = np.arange(count, dtype=np.uint32)
    x += np.uint32(first & _MASK32)  # uint32 arithmetic wraps: the index mod 2**32
    x *= np.uint32(0x9E3779B9)
    x += np.uint32(seed & _MASK32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x21F0AAAD)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x735A2D97)
    x ^= x >> np.uint32(15)
    return x


def round_elements(v: np.ndarray, fmt: _formats.Format, random: np.ndarray | None) -> np.ndarray:
    """Codes for float32 `v`, already clamped to +-fmt.max.

    `random` is None for round-to-nearest-even, else one uint32 per element. A float32
    subnormal gives a zero of its sign either way (every element format's smallest
    subnormal is far above float32's), so `v` need not be flushed first.
    """
    if random is not None:
        v = _stochastic_values(v, fmt, random)  # on the format's grid: the cast is exact
    return nearest_codes(v, fmt)


def nearest_codes(v: np.ndarray, fmt: _formats.Format) -> np.ndarray:
    """`_formats.encode_in_range(v, fmt)` by ml_dtypes' cast, several times faster.

    The two agree for every float32 of magnitude <= fmt.max, of either sign, subnormals
    included: each rounds to nearest, ties to the even code (tests/test_chunked.py walks
    every exponent, kept mantissa and tie pattern of each format).
    """
    return v.astype(_ML_DTYPES[fmt.name]).view(np.uint8)


def _stochastic_values(v: np.ndarray, fmt: _formats.Format, random: np.ndarray) -> np.ndarray:
    """The value of `fmt` that each element of `v` rounds to stochastically (spec §4).

    On the grid of the element's binade (the subnormal grid below the smallest normal),
    |v| rounds up where the dropped fraction's top 24 bits plus the top 24 random bits
    reach 2**24. Every product is by a power of two, so exact; uint32 throughout.
    """
    a = _bits.bits(v) & _bits.ABS
    e = a >> np.uint32(23)  # e = max(E(v) - 127, 1 - bias), kept as e + 127
    np.maximum(e, np.uint32(128 - fmt.bias), out=e)
    # 2**(mbits - e) is normal for |v| <= fmt.max: its exponent field.
    step = _bits.from_bits((np.uint32(254 + fmt.mbits) - e) << np.uint32(23))
    t = np.multiply(_bits.from_bits(a), step, dtype=np.float32)
    n = np.floor(t)
    t -= n  # the fraction, exact
    t *= np.float32(1 << 24)
    fraction24 = t.astype(np.uint32)  # floor: t >= 0
    fraction24 += random >> np.uint32(8)  # < 2**25: no wrap
    n += fraction24 >= np.uint32(1 << 24)
    # n <= fmt.max / 2**(e - mbits): fmt.max is on every binade's grid, so no clamp.
    n /= step
    return np.copysign(n, v, out=n)


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
