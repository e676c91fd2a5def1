"""The element step's rounding (spec §4): nearest-even, or stochastic from uint32 bits.

The random bits are uint32 values carried in int64 tensors: torch lacks most uint32
operations on CPU, and int64 holds every intermediate of the hash exactly. An eager CPU
slab (`_quantize._in_slabs_of`) takes the `_on_host` functions instead: the same bits
held in int32 (four bytes an element, not eight; int32 ops on the CPU are 2-10x faster
than int64 ones), hashed through NumPy uint32 views of those buffers (NumPy has the
logical shifts torch lacks for 32-bit integers), and its codes computed from them in
integer ops into reused buffers.
"""

import numpy as np
import torch

import lowp
from lowp_torch import _bits, _encode, _scratch

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) (int64) and a constant c < 2**32.

    x * c itself can reach 2**64 and overflow int64 (undefined behaviour in the C++ and
    Triton code Inductor writes), so c is split into 16-bit halves: each partial
    product stays below 2**48.
    """
    low, high = c & 0xFFFF, c >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def check_seed_and_offset(seed, offset) -> bool:
    """TypeError naming the value unless seed is an int and offset an int or a 0-d int64
    tensor, as `lowp.random_bits` asks; returns whether offset is such a tensor."""
    tensor_offset = (
        isinstance(offset, torch.Tensor) and offset.dtype == torch.int64 and offset.dim() == 0
    )
    for field, value in (("seed", seed), ("offset", offset)):
        if field == "offset" and tensor_offset:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"random_bits: {field} must be an int, got {value!r}")
    return tensor_offset


def random_bits(seed: int, shape, offset: int = 0, *, device=None) -> torch.Tensor:
    """One uint32 per element of `shape`, as int64: exactly `lowp.random_bits`.

    The hash of spec §4 of each element's flat C-order index, computed on `device`.

    Args:
      seed: any int, taken mod 2**32.
      shape: the shape of the tensor as passed to quantize.
      offset: added to each index (mod 2**32); an int, or a 0-d int64 tensor holding a
        value computed on the device (the training recipes' data offsets, spec §8).
      device: where to make the bits (default: the CPU).

    Returns:
      An int64 tensor of `shape` holding values in [0, 2**32).

    >>> random_bits(0, (3,)).tolist()
    [0, 1684164658, 3653269916]
    """
    tensor_offset = check_seed_and_offset(seed, offset)
    seed = int(seed)
    offset = offset if tensor_offset else int(offset)
    shape = (int(shape),) if isinstance(shape, int) else tuple(int(n) for n in shape)
    count = 1
    for n in shape:
        count *= n
    index = (torch.arange(count, dtype=torch.int64, device=device) + (offset & _MASK32)) & _MASK32
    x = (_mul32(index, 0x9E3779B9) + (seed & _MASK32)) & _MASK32
    x = x ^ (x >> 16)  # x >= 0, so >> is the logical shift of the spec
    x = _mul32(x, 0x21F0AAAD)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x735A2D97)
    x = x ^ (x >> 15)
    return x.reshape(shape)


def round_elements(v: torch.Tensor, fmt: lowp.Format, random: torch.Tensor | None) -> torch.Tensor:
    """uint8 codes for float32 `v`, already clamped to ±fmt.max and flushed.

    `random` is None for round-to-nearest-even, else an int64 tensor of uint32 values,
    one per element. Every float operation below is exact (products by powers of two,
    floor, the fraction), so no contraction or reassociation can change a bit.
    """
    if random is None:
        return _encode.encode(v, fmt)
    b = _bits.bits(v)
    sign = b & _bits.SIGN
    a = _bits.from_bits(b & _bits.ABS)
    e = torch.clamp(_bits.biased_exponent(b) - 127, min=1 - fmt.bias)
    t = a * _bits.pow2(fmt.mbits - e)  # exact
    n = torch.floor(t)
    f = t - n  # exact
    fraction24 = torch.floor(f * float(1 << 24)).to(torch.int64)  # exact, < 2**24
    up = (fraction24 + (random >> 8)) >= (1 << 24)
    q = (n + up.to(torch.float32)) * _bits.pow2(e - fmt.mbits)  # exact
    q = torch.clamp(q, max=fmt.max)
    return _encode.encode(_bits.from_bits(_bits.bits(q) | sign), fmt)


def random_bits_on_host(
    seed: int, first: int, count: int, scratch: _scratch.Scratch
) -> torch.Tensor:
    """`lowp.random_bits(seed, (count,), first)` as int32 of the same bits, on the CPU.

    The hash of spec §4.2 on NumPy uint32 views of `scratch` buffers: NumPy's uint32
    has the logical shifts of the spec, where torch's int32 needs an arithmetic shift
    and a mask for each (nine passes instead of twelve: docs/performance.md, stochastic
    rounding and NVFP4 on the host); uint32 adds and multiplies wrap mod 2**32 as the
    spec's do.
    (i + first) * M + seed is read as i * M (made once a call) plus first * M + seed.
    Written into `scratch`.
    """
    x = scratch.take("random", torch.int32, (count,))
    shifted = _uint32(scratch.take("shifted", torch.int32, (count,)))
    bits = _uint32(x)
    start = np.uint32((first * 0x9E3779B9 + seed) & _MASK32)
    np.add(_uint32(scratch.index_products(count)), start, out=bits)
    for shift, multiplier in _HASH_STEPS:
        np.right_shift(bits, shift, out=shifted)
        bits ^= shifted
        if multiplier is not None:
            bits *= multiplier
    return x


_HASH_STEPS = (
    (np.uint32(16), np.uint32(0x21F0AAAD)),
    (np.uint32(15), np.uint32(0x735A2D97)),
    (np.uint32(15), None),
)


def _uint32(t: torch.Tensor) -> np.ndarray:
    """The NumPy uint32 view of a contiguous int32 CPU tensor (no copy)."""
    return t.numpy().view(np.uint32)


def grid_exponent(fmt: lowp.Format) -> int:
    """K = mbits - emin + 24: |v| * 2**K is |v| on the subnormal grid of `fmt` with 24
    fraction bits, the scaled magnitude `stochastic_codes_on_host` can take."""
    return fmt.mbits - (1 - fmt.bias) + 24


def stochastic_codes_on_host(
    magnitude: torch.Tensor,
    sign_bits: torch.Tensor,
    fmt: lowp.Format,
    random: torch.Tensor,
    scratch: _scratch.Scratch,
    out: torch.Tensor,
    scaled: bool = False,
) -> None:
    """Spec §4.1's stochastic rounding of each element of an eager CPU slab into the
    uint8 tensor `out`: the element's |v| is the float32 `magnitude` (contiguous, >= 0,
    clamped to fmt.max here; overwritten), or with `scaled` |v| * 2**K (K =
    `grid_exponent(fmt)`: the caller folds 2**K into its multipliers where their
    product stays finite), its sign bit 31 of the int32 `sign_bits`, its random bits
    the int32 `random` (uint32 bits; overwritten).

    `lowp._rounding.stochastic_codes` in int32 ops; that docstring derives the two
    parts. Here they are added before the one shift that both end in: with a =
    min(magnitude's pattern, fmt.max's), MINB the pattern of the format's smallest
    normal and R = r >>> 8, the magnitude code is (T + R + (max(a, MINB) - MINB) *
    2**(mbits + 1)) >> 24, T = floor(min(a, MINB) * 2**K) (below 2**(mbits + 24), and
    exactly that at or above MINB): the first part's dropped bits (k = 23 - mbits of
    them) times 2**(24 - k) line up with R's 24. MINB * 2**(mbits + 1) is a multiple of
    2**24, so it is left in and taken off the low byte at the end; the int32 sum wraps
    mod 2**32, which keeps every bit of that byte.

    A scaled magnitude is RN32(|x| * m * 2**K) = |v| * 2**K exactly where |v| is a
    normal float32, so its pattern is a's plus K << 23 and the bounds move with it (the
    surplus K * 2**(mbits + 24) of the sum leaves the low byte with the MINB term); where
    |v| is a float32 subnormal, T is 0 and max(a, MINB) is MINB either way. Three
    slab-sized buffers in all (`random` among them): the fewer, the more of them stay in
    the cache on a busy machine.
    """
    i32, c = torch.int32, scratch.constant
    k_grid = grid_exponent(fmt)
    lift = k_grid << 23 if scaled else 0  # the pattern's offset in a scaled magnitude
    min_normal_bits = ((128 - fmt.bias) << 23) + lift
    shape = tuple(magnitude.shape)
    a = _bits.bits(magnitude)
    normal = scratch.take("normal", i32, shape)
    # clamp's bounds stay Python numbers: with tensor bounds ATen takes a slower kernel
    torch.clamp(a, min_normal_bits, _encode.max_bits(fmt) + lift, out=normal)
    a.clamp_(max=min_normal_bits)
    if not scaled:  # exact: a power of two, T below 2**(mbits + 24)
        magnitude.mul_(c(2.0**k_grid, torch.float32))
    total = random
    np.right_shift(_uint32(random), _R_SHIFT, out=_uint32(random))  # R = r >>> 8
    a.copy_(magnitude)  # T, in place: truncation is the floor, as magnitude >= 0
    total.add_(a)
    total.add_(normal, alpha=1 << (fmt.mbits + 1))
    total.bitwise_right_shift_(c(24, i32))
    torch.bitwise_right_shift(sign_bits, c(31, i32), out=a)  # -1 where negative
    total.sub_(a, alpha=1 << (fmt.ebits + fmt.mbits))
    out.copy_(total)  # int32 -> uint8 keeps the low byte
    # (MINB + lift) * 2**(mbits + 1) >> 24, mod 256 (uint8 wraps)
    surplus = (128 - fmt.bias + (k_grid if scaled else 0)) << fmt.mbits
    out.sub_(c(surplus & 0xFF, torch.uint8))


_R_SHIFT = np.uint32(8)
