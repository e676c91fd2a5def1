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


def random_bits_from(seed: int, first: int, count: int, scratch=None) -> np.ndarray:
    """The bits of flat indices `first` .. `first + count - 1` (each taken mod 2**32): a
    slice of `random_bits`, so a tensor quantized a slab at a time draws the same bits.
    With a `Scratch`, written into its buffers (valid until its next use)."""
    scratch = scratch or Scratch()
    x = scratch.take("random", np.uint32, (count,))
    shifted = scratch.take("random_shifted", np.uint32, (count,))
    # uint32 arithmetic wraps: the index mod 2**32
    np.add(scratch.indices(count), np.uint32(first & _MASK32), out=x)
    x *= np.uint32(0x9E3779B9)
    x += np.uint32(seed & _MASK32)
    for shift, multiplier in ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, None)):
        np.right_shift(x, np.uint32(shift), out=shifted)
        x ^= shifted
        if multiplier is not None:
            x *= np.uint32(multiplier)
    return x


class Scratch:
    """Buffers that a run of slabs reuses: arrays allocated afresh for each slab are
    paged in again each time (the allocator gives freed memory back), which on a CPU
    costs more than the arithmetic on them. `take` returns a view valid until the next
    `take` of the same name."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}
        self._indices = np.zeros(0, np.uint32)

    def take(self, name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        size = int(np.prod(shape, dtype=np.int64))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = self._buffers[name] = np.empty(size, dtype)
        return buffer[:size].reshape(shape)

    def indices(self, count: int) -> np.ndarray:
        """0, 1, ..., count - 1 as uint32 (read-only: shared by every call)."""
        if len(self._indices) < count:
            self._indices = np.arange(count, dtype=np.uint32)
        return self._indices[:count]


def round_elements(
    v: np.ndarray, fmt: _formats.Format, random: np.ndarray | None, scratch=None
) -> np.ndarray:
    """Codes for float32 `v`, already clamped to +-fmt.max.

    `random` is None for round-to-nearest-even, else one uint32 per element. A float32
    subnormal gives a zero of its sign either way (every element format's smallest
    subnormal is far above float32's), so `v` need not be flushed first.
    """
    if random is not None:  # on the format's grid: the cast is exact
        v = _stochastic_values(v, fmt, random, scratch or Scratch())
    return nearest_codes(v, fmt)


def nearest_codes(v: np.ndarray, fmt: _formats.Format) -> np.ndarray:
    """`_formats.encode_in_range(v, fmt)` by ml_dtypes' cast, several times faster.

    The two agree for every float32 of magnitude <= fmt.max, of either sign, subnormals
    included: each rounds to nearest, ties to the even code (tests/test_chunked.py walks
    every exponent, kept mantissa and tie pattern of each format).
    """
    return v.astype(_ML_DTYPES[fmt.name]).view(np.uint8)


def _stochastic_values(
    v: np.ndarray, fmt: _formats.Format, random: np.ndarray, scratch: Scratch
) -> np.ndarray:
    """The value of `fmt` that each element of `v` rounds to stochastically (spec §4).

    On the grid of the element's binade (the subnormal grid below the smallest normal),
    |v| rounds up where the dropped fraction's top 24 bits plus the top 24 random bits
    reach 2**24. Every product is by a power of two, so exact. Written in place into
    `scratch`'s buffers.
    """
    step_bits = scratch.take("step", np.uint32, v.shape)
    t = scratch.take("t", np.float32, v.shape)
    n = scratch.take("n", np.float32, v.shape)
    fraction24 = scratch.take("fraction24", np.uint32, v.shape)
    # e = max(E(v) - 127, 1 - bias), kept as e + 127; 2**(mbits - e) is normal for
    # |v| <= fmt.max, so its pattern is its exponent field.
    np.right_shift(_bits.bits(v), np.uint32(23), out=step_bits)
    step_bits &= np.uint32(0xFF)
    np.maximum(step_bits, np.uint32(128 - fmt.bias), out=step_bits)
    np.subtract(np.uint32(254 + fmt.mbits), step_bits, out=step_bits)
    step_bits <<= np.uint32(23)
    step = _bits.from_bits(step_bits)
    np.abs(v, out=t)
    t *= step
    np.floor(t, out=n)
    t -= n  # the fraction, exact
    t *= np.float32(1 << 24)
    np.copyto(fraction24, t, casting="unsafe")  # floor: t >= 0
    shifted = _bits.bits(t)  # t is spent: its buffer takes the random bits' top 24
    np.right_shift(random, np.uint32(8), out=shifted)
    fraction24 += shifted  # < 2**25: no wrap
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
