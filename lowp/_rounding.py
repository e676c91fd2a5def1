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
    # uint32 arithmetic wraps: (i + first) * M + seed is i * M + (first * M + seed)
    start = (first * 0x9E3779B9 + seed) & _MASK32
    np.add(scratch.index_products(count), np.uint32(start), out=x)
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
        self._index_products = np.zeros(0, np.uint32)

    def take(self, name: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        size = int(np.prod(shape, dtype=np.int64))
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = self._buffers[name] = np.empty(size, dtype)
        return buffer[:size].reshape(shape)

    def index_products(self, count: int) -> np.ndarray:
        """i * 0x9E3779B9 mod 2**32 for i = 0 .. count - 1, the hash's first product
        (read-only: shared by every slab)."""
        if len(self._index_products) < count:
            self._index_products = np.arange(count, dtype=np.uint32)
            self._index_products *= np.uint32(0x9E3779B9)
        return self._index_products[:count]


def round_elements(
    v: np.ndarray, fmt: _formats.Format, random: np.ndarray | None, scratch=None
) -> np.ndarray:
    """Codes for float32 `v`, already clamped to +-fmt.max.

    `random` is None for round-to-nearest-even, else one uint32 per element. A float32
    subnormal gives a zero of its sign either way (every element format's smallest
    subnormal is far above float32's), so `v` need not be flushed first.
    """
    scratch = scratch or Scratch()
    if random is not None:
        return stochastic_codes(v, fmt, random, scratch)
    return nearest_codes(v, fmt, scratch)


def nearest_codes(v: np.ndarray, fmt: _formats.Format, scratch=None) -> np.ndarray:
    """`_formats.encode_in_range(v, fmt)` for float32 `v` with |v| <= fmt.max, in a
    dozen uint32 passes over `scratch` buffers: 2-4x faster than ml_dtypes' cast (a
    scalar loop, slowest for float6 and float4), and the same codes
    (tests/test_chunked.py walks every exponent, kept mantissa and tie pattern of each
    format against the integer encoder and ml_dtypes' cast).

    With a = |v|'s pattern, k = 23 - mbits and MINB the pattern of the format's
    smallest normal 2**(1 - bias), the magnitude code is the sum of two parts:
    - at or above MINB, the pattern rounded to nearest even at bit k, an integer carry
      that rolls into the exponent field: a' = max(a, MINB), (a' + 2**(k-1) - 1 +
      ((a' >> k) & 1)) >> k, which is the code plus C = (127 - bias) << mbits (and
      C + 2**mbits below MINB);
    - below MINB, the subnormal grid's step s = 2**(emin - mbits): min(a, MINB) + B in
      float32, where B = 2**(emin - mbits + 23) has ulp s, rounds to the nearest
      multiple of s, ties to the even one; its pattern is B's plus that multiple
      (2**mbits at or above MINB).
    So the sum less C + 2**mbits + B's pattern is the code; the sign bit goes on top. A
    float32 subnormal gives 0 in both parts.
    """
    scratch = scratch or Scratch()
    k = 23 - fmt.mbits
    min_normal_bits = np.uint32((128 - fmt.bias) << 23)
    grid = np.float32(2.0 ** ((1 - fmt.bias) - fmt.mbits + 23))  # B
    a = scratch.take("a", np.uint32, v.shape)
    normal = scratch.take("normal", np.uint32, v.shape)
    shifted = scratch.take("shifted", np.uint32, v.shape)
    np.bitwise_and(_bits.bits(v), _bits.ABS, out=a)
    np.maximum(a, min_normal_bits, out=normal)
    np.right_shift(normal, np.uint32(k), out=shifted)
    shifted &= np.uint32(1)
    normal += shifted
    normal += np.uint32((1 << (k - 1)) - 1)
    normal >>= np.uint32(k)
    np.minimum(a, min_normal_bits, out=a)
    on_grid = _bits.from_bits(a)  # a view: the add writes a's patterns
    on_grid += grid  # one RNE add onto B's grid: exact
    normal += a
    normal -= np.uint32(((128 - fmt.bias) << fmt.mbits) + int(grid.view(np.uint32)))
    sign_bit = fmt.ebits + fmt.mbits
    np.right_shift(_bits.bits(v), np.uint32(31 - sign_bit), out=shifted)
    shifted &= np.uint32(1 << sign_bit)
    normal |= shifted
    return normal.astype(np.uint8)


def stochastic_codes(
    v: np.ndarray, fmt: _formats.Format, random: np.ndarray, scratch: Scratch
) -> np.ndarray:
    """The codes of spec §4.1's stochastic rounding of `v` (float32, |v| <= fmt.max),
    one uint32 of `random` each, computed on the bit patterns in uint32 arithmetic.

    Spec §4.1 in integers, with a = |v|'s pattern, k = 23 - mbits and MINB the pattern
    of the format's smallest normal 2**(1 - bias):
    - at or above MINB (the element's own binade): t = significand / 2**k, so n and
      floor(f * 2**24) are the significand's kept bits and its k dropped bits shifted
      up by 24 - k; `up` is whether the dropped bits plus `r >> (32 - k)` carry into
      bit k, and adding them to the pattern carries n + up into the exponent field
      too: the code is ((a + (r >> (32 - k))) >> k) less the bias difference.
    - below MINB (the subnormal grid): T = floor(t * 2**24) = floor(a * 2**(mbits -
      emin + 24)), exact in float32 (a product by a power of two) and below 2**27, and
      n + up = (T + (r >> 8)) >> 24.
    Both are computed for every element, the first from max(a, MINB) - MINB (0 below
    MINB), the second from min(a, MINB) (2**mbits at or above it), and added before
    the one shift both end in: (T + (r >> 8) + (max(a, MINB) - MINB) * 2**(mbits + 1))
    >> 24. A float32 subnormal gives 0 in both. `tests/test_quantize.py` holds this to
    the spec's float steps computed with exact rationals.
    """
    min_normal_bits = np.uint32((128 - fmt.bias) << 23)  # the pattern of 2**(1 - bias)
    a = scratch.take("a", np.uint32, v.shape)
    normal = scratch.take("normal", np.uint32, v.shape)
    shifted = scratch.take("shifted", np.uint32, v.shape)
    total = scratch.take("total", np.int32, v.shape).view(np.uint32)
    np.bitwise_and(_bits.bits(v), _bits.ABS, out=a)
    np.maximum(a, min_normal_bits, out=normal)
    np.minimum(a, min_normal_bits, out=a)
    grid = _bits.from_bits(a)  # a view: the product overwrites a
    grid *= np.float32(2.0 ** (fmt.mbits - (1 - fmt.bias) + 24))  # exact: T, below 2**27
    np.copyto(total.view(np.int32), grid, casting="unsafe")  # truncation: floor, grid >= 0
    np.right_shift(random, np.uint32(8), out=shifted)
    total += shifted
    # The two parts in one sum: the first part's dropped bits (k = 23 - mbits of them)
    # times 2**(24 - k) line up with r >> 8; MINB * 2**(mbits + 1) is a multiple of 2**24,
    # taken off after the shift (uint32 wraps mod 2**32, which keeps the low byte).
    normal <<= np.uint32(fmt.mbits + 1)
    total += normal
    total >>= np.uint32(24)
    total -= np.uint32((128 - fmt.bias) << fmt.mbits)  # MINB * 2**(mbits + 1) >> 24
    sign_bit = fmt.ebits + fmt.mbits
    np.right_shift(_bits.bits(v), np.uint32(31 - sign_bit), out=shifted)
    shifted &= np.uint32(1 << sign_bit)
    total |= shifted  # the low byte is the code, below 2**sign_bit: no carry into the sign
    return total.astype(np.uint8)


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
