"""The element encoder of spec §2 and the code decoders.

float8 (e4m3fn, e5m2) goes through torch's native casts, on the inputs where they equal
spec §2: native float -> float8 casts saturate on some devices and give NaN on others
(spec §0.5), but callers clamp to ±max and zero poisoned groups first, and within that
range the casts round to nearest even exactly as E_fmt (measured equal to `lowp.encode`
on 3M values per format: every code, every midpoint and ±3 ulp around it, uniform and
tiny magnitudes; the conformance suites check every backend). On the CPU they are
12-30x faster than the integer port below. float6 and float4 have no torch cast, so
their codes are built from the float32 bits by that port of `lowp.encode`,
and their values decoded the same way.
"""

import itertools

import numpy as np
import torch

import lowp
from lowp_torch import _bits, _layouts, _scratch, _storage

_NATIVE_FLOAT8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def _native_float8(t: torch.Tensor, fmt: lowp.Format) -> torch.dtype | None:
    """The torch dtype to cast through for `fmt`, where that cast is exact; else None.

    Eagerly the cast is c10's on CPU and CUDA alike. Under torch.compile, Inductor's C++
    code calls the same c10 conversion on the CPU, and its Triton code on a GPU is
    Triton's conversion, the direct `cvt.rn.satfinite.*.f32` only on sm_90+ (on sm_89 it
    rounds to f16 first; below that e4m3 does not compile): elsewhere the integer port.
    """
    native = _NATIVE_FLOAT8.get(fmt.name)
    if native is None or not t.is_cuda or not _storage.traced(t):
        return native
    return native if torch.cuda.get_device_capability(t.device) >= (9, 0) else None


def encode(v: torch.Tensor, fmt: lowp.Format) -> torch.Tensor:
    """E_fmt of spec §2: float32 -> uint8 codes, round to nearest, ties to the even code.

    `v` must be finite with |v| <= fmt.max (callers clamp first). Element subnormals
    are produced, float32 subnormals round to a signed zero, the sign bit is kept.
    """
    native = _native_float8(v, fmt)
    if native is not None:
        return v.to(native).view(torch.uint8)
    if fmt.ebits + fmt.mbits <= 3:  # float4: eight magnitudes, seven midpoints
        if _storage.traced(v):  # the compiler fuses the mask passes into one kernel
            return _encode_by_midpoints(v, fmt)
        return _encode_by_table(v, fmt)
    b = _bits.bits(v)
    sign = (b >> 31) & 1
    e32 = _bits.biased_exponent(b)
    mant = b & _bits.MANT_MASK
    # 24-bit significand; a float32 subnormal has no implicit bit and exponent 1.
    sig = mant | (~_bits.zero_mask(e32) & (1 << 23))
    target_exp = torch.clamp(e32, min=1) - 127 + fmt.bias  # biased exponent in fmt
    field = torch.clamp(target_exp, min=1)  # subnormals share the min-normal exponent
    # Bits of `sig` dropped: the mantissa narrowing plus the subnormal shift, capped at
    # 25 (nothing kept, remainder below half).
    shift = torch.clamp(23 - fmt.mbits + (field - target_exp), max=25)
    one = torch.ones_like(shift)
    kept = sig >> shift
    rest = sig & ((one << shift) - 1)
    half = one << (shift - 1)
    above = _bits.negative_mask(half - rest)  # masks: rest > half, rest == half
    tie_to_odd = _bits.zero_mask(rest ^ half) & -(kept & 1)
    round_up = (above | tie_to_odd) & 1
    # `kept` carries the implicit bit at position mbits for normals, so the exponent
    # field is added as (field - 1); a mantissa carry rolls into the exponent.
    magnitude = ((field - 1) << fmt.mbits) + kept + round_up
    code = (sign << (fmt.ebits + fmt.mbits)) | magnitude
    return code.to(torch.uint8)


# A float6 format and the float8 format with its mantissa width: scaled by 2**-(the
# difference of their biases), a float6 value's exponent field, mantissa and subnormal
# grid are the float8 value's, so the float8 code of the scaled value is the float6
# code with the sign moved down two bits (every float6 magnitude is far below the
# float8 max, and the scaling is exact down to the float32 subnormals, which both
# encode to a signed zero).
_CARRIERS = {"float6_e2m3fn": "float8_e4m3fn", "float6_e3m2fn": "float8_e5m2"}


def cast_on_host(fmt: lowp.Format) -> bool:
    """Whether `float8_codes_on_host` encodes `fmt`: float8 and float6, not float4."""
    return fmt.name in _NATIVE_FLOAT8 or fmt.name in _CARRIERS


def float8_codes_on_host(
    v: torch.Tensor, fmt: lowp.Format, scratch: _scratch.Scratch, out: torch.Tensor
) -> None:
    """`encode` of the contiguous float32 `v` (|v| <= fmt.max; overwritten for float6)
    into the uint8 tensor `out` of its shape, in eager mode: float8 by torch's cast
    straight into `out`, float6 by the cast to its carrier float8 (`_CARRIERS`) of v
    times 2**-(bias difference), its sign bit moved from bit 7 to bit 5."""
    carrier = _CARRIERS.get(fmt.name)
    if carrier is None:
        out.view(_NATIVE_FLOAT8[fmt.name]).copy_(v)
        return
    shift = lowp.FORMATS[carrier].bias - fmt.bias
    v.mul_(scratch.constant(2.0**-shift, torch.float32))  # exact: a power of two
    codes = scratch.take("carrier", torch.uint8, tuple(v.shape))
    codes.view(_NATIVE_FLOAT8[carrier]).copy_(v)
    u8, c = torch.uint8, scratch.constant
    torch.bitwise_and(codes, c(0x1F, u8), out=out)  # exponent and mantissa
    codes.bitwise_right_shift_(c(2, u8))
    codes.bitwise_and_(c(0x20, u8))  # the sign, now at bit 5
    out.bitwise_or_(codes)


def nearest_codes_on_host(
    magnitude: torch.Tensor,
    sign_bits: torch.Tensor,
    fmt: lowp.Format,
    scratch: _scratch.Scratch,
    out: torch.Tensor,
) -> None:
    """E_fmt of each element of an eager CPU slab, into the uint8 tensor `out`: the
    element's |v| is the float32 `magnitude` (contiguous, >= 0, clamped to fmt.max here;
    overwritten), its sign bit 31 of the int32 `sign_bits`. A dozen int32 passes on
    reused buffers, where `encode`'s port allocates twenty-odd temporaries.

    With a = min(magnitude's pattern, fmt.max's), k = 23 - mbits and MINB the pattern of
    the format's smallest normal 2**(1 - bias), the magnitude code is the sum of two parts:
    - at or above MINB: a' = max(a, MINB) rounded to nearest even at bit k, an integer
      carry that rolls into the exponent field, (a' + 2**(k-1) - 1 + ((a' >> k) & 1))
      >> k, which is the code plus C = (128 - bias) << mbits less 2**mbits (C exactly
      below MINB);
    - below MINB, the subnormal grid's step s = 2**(emin - mbits): min(a, MINB) + B in
      float32, where B = 2**(emin - mbits + 23) has ulp s, rounds to the nearest
      multiple of s, ties to the even one; its pattern is B's plus that multiple
      (2**mbits at or above MINB).
    B's pattern is a multiple of 256 and only the low byte is kept, so the sum less C
    (mod 256), with the sign bit added, is the code. A float32 subnormal gives 0 in both.
    """
    i32, c = torch.int32, scratch.constant
    k, min_normal_bits = 23 - fmt.mbits, (128 - fmt.bias) << 23
    grid_step_exponent = (1 - fmt.bias) - fmt.mbits
    a = _bits.bits(magnitude)
    shape = tuple(magnitude.shape)
    normal = scratch.take("normal", i32, shape)
    odd = scratch.take("shifted", i32, shape)
    # clamp's bounds stay Python numbers: with tensor bounds ATen takes a slower kernel
    torch.clamp(a, min_normal_bits, max_bits(fmt), out=normal)
    torch.bitwise_right_shift(normal, c(k, i32), out=odd)
    odd.bitwise_and_(c(1, i32))
    normal.add_(odd)
    normal.add_(c((1 << (k - 1)) - 1, i32))
    normal.bitwise_right_shift_(c(k, i32))
    a.clamp_(max=min_normal_bits)
    # one RNE add onto B's grid: exact
    magnitude.add_(c(2.0 ** (grid_step_exponent + 23), torch.float32))
    normal.add_(a)  # B's pattern, a multiple of 2**23, drops out of the low byte
    torch.bitwise_right_shift(sign_bits, c(31, i32), out=odd)  # -1 where negative, else 0
    normal.sub_(odd, alpha=1 << (fmt.ebits + fmt.mbits))
    out.copy_(normal)  # int32 -> uint8 keeps the low byte
    out.sub_(c(((128 - fmt.bias) << fmt.mbits) & 0xFF, torch.uint8))  # C mod 256: wraps


def max_bits(fmt: lowp.Format) -> int:
    """The float32 pattern of fmt.max."""
    return int(np.float32(fmt.max).view(np.int32))


def _midpoint_keys(fmt: lowp.Format) -> tuple[int, ...]:
    """For each pair of neighbouring magnitudes of `fmt`, the float32 pattern a |v|
    pattern must exceed to round up: their midpoint's, less one where the tie goes up
    (to the even code above). Every midpoint of float4 is exact in float32."""
    values = decode(torch.arange(1 << (fmt.ebits + fmt.mbits), dtype=torch.int32), fmt).tolist()
    keys = []
    for code, (low, high) in enumerate(itertools.pairwise(values)):
        midpoint = np.float32((low + high) / 2)
        if float(midpoint) != (low + high) / 2:
            raise AssertionError(f"{fmt.name}: midpoint of {low} and {high} is not a float32")
        tie_goes_up = (code + 1) % 2 == 0
        keys.append(int(midpoint.view(np.int32)) - (1 if tie_goes_up else 0))
    return tuple(keys)


def _encode_by_midpoints(v: torch.Tensor, fmt: lowp.Format) -> torch.Tensor:
    """E_fmt for a format of eight magnitudes: the magnitude code is the number of
    midpoints |v| passes (ties to the even code), counted with int32 masks; the same
    codes as the shift-and-round port below, in fewer passes (no per-element shifts)."""
    b = _bits.bits(v)
    magnitude_bits = b & _bits.ABS
    passed = torch.zeros_like(b)
    for key in _MIDPOINT_KEYS[fmt.name]:
        passed = passed + _bits.negative_mask(key - magnitude_bits)  # -1 where |v| > key
    sign = (b >> 31) & 1
    return ((sign << (fmt.ebits + fmt.mbits)) | -passed).to(torch.uint8)


# A float4 midpoint key is k * 2**21 (its tie rounds down) or k * 2**21 - 1 (up), so the
# code of a float32 pattern follows from its top 11 bits (sign, exponent, two mantissa
# bits) and whether any of the 21 bits below them is set.
_CLASS_LOW_BITS = (1 << 21) - 1


def _encode_table(fmt: lowp.Format, device: torch.device) -> torch.Tensor:
    """(4096,) uint8: the code of every pattern class `_encode_by_table` indexes, each
    the midpoint encoder's code of one pattern of the class (the same for all of them,
    as every key sits on a class boundary; checked here)."""
    table = _FP4_ENCODE_TABLES.get((fmt.name, device))
    if table is None:
        if any((key + 1) & _CLASS_LOW_BITS > 1 for key in _MIDPOINT_KEYS[fmt.name]):
            raise AssertionError(f"{fmt.name}: a midpoint key is inside a pattern class")
        index = torch.arange(4096, dtype=torch.int32, device=device)
        sign = (index >> 11) * _bits.SIGN  # bit 11 of the index is the sign bit
        patterns = sign | (((index >> 1) & 0x3FF) << 21) | (index & 1)
        table = _encode_by_midpoints(_bits.from_bits(patterns), fmt)
        _FP4_ENCODE_TABLES[(fmt.name, device)] = table
    return table


def _encode_by_table(v: torch.Tensor, fmt: lowp.Format) -> torch.Tensor:
    """`_encode_by_midpoints` in eager mode: one gather from a 4096-entry table of codes
    indexed by the top 11 bits of each pattern and a flag for the 21 bits below them:
    six integer passes where the midpoint count takes over twenty (docs/performance.md,
    CPU inference)."""
    b = _bits.bits(v)
    low_set = _bits.negative_mask(-(b & _CLASS_LOW_BITS))  # -1 where any low bit is set
    index = ((b >> 20) & 0xFFE) - low_set
    table = _encode_table(fmt, v.device)
    return torch.index_select(table, 0, index.reshape(-1)).reshape(v.shape)


def decode(codes: torch.Tensor, fmt: lowp.Format) -> torch.Tensor:
    """float32 value of each code (an integer tensor, one code an element).

    NaN codes give the canonical NaN 0x7FC00000 (as `lowp.decode`), e5m2's Inf codes
    give ±Inf. Every value is exact in float32 and normal there.

    In eager mode one-byte codes are read from a 256-entry table of every byte's value,
    made by the computation below: on the CPU c10's float8 -> float32 cast is a scalar
    loop, about 10x the gather's time (docs/performance.md, CPU inference).
    """
    byte_codes = codes.dtype in (torch.uint8, _NATIVE_FLOAT8.get(fmt.name))
    if byte_codes and not _storage.traced(codes):
        table = _DECODE_TABLES.get((fmt.name, codes.device))
        if table is None:
            every_byte = torch.arange(256, dtype=torch.int32, device=codes.device)
            table = _decode_computed(every_byte.to(torch.uint8), fmt)
            _DECODE_TABLES[(fmt.name, codes.device)] = table
        index = codes.view(torch.uint8).reshape(-1).to(torch.int32)
        return torch.index_select(table, 0, index).reshape(codes.shape)
    return _decode_computed(codes, fmt)


_DECODE_TABLES: dict = {}  # (format, device) -> (256,) float32, filled in eager mode only


def _decode_computed(codes: torch.Tensor, fmt: lowp.Format) -> torch.Tensor:
    """`decode` by a native cast (float8) or integer passes, any integer code dtype."""
    native = _native_float8(codes, fmt)
    if native is not None:  # every float8 value is a float32 one: the cast is exact
        if codes.dtype != native:  # uint8 codes, or wider integers holding one code each
            codes = (codes if codes.dtype == torch.uint8 else codes.to(torch.uint8)).view(native)
        values = _bits.bits(codes.to(torch.float32))
        return _bits.from_bits(_bits.select(_bits.nan_mask(values), _bits.NAN_F32, values))
    c = codes.to(torch.int32)
    sign = ((c >> (fmt.ebits + fmt.mbits)) & 1) << 31
    exp_field = (c >> fmt.mbits) & ((1 << fmt.ebits) - 1)
    mant = c & ((1 << fmt.mbits) - 1)
    normal = ((exp_field - fmt.bias + 127) << 23) | (mant << (23 - fmt.mbits))
    # A subnormal code is m * 2**(1 - bias - mbits); normalise m by hand. With
    # mbits <= 3, m in 1..7 has its leading one at bit `lead` = 0, 1 or 2.
    lead = 1 + _bits.zero_mask(mant >> 1) + (mant >> 2)  # (mant >= 2) + (mant >= 4)
    sub_exp = lead + (1 - fmt.bias - fmt.mbits + 127)
    sub_mant = (mant - (torch.ones_like(lead) << lead)) << (23 - lead)
    subnormal = ((sub_exp << 23) | sub_mant) & ~_bits.zero_mask(mant)
    magnitude = _bits.select(_bits.zero_mask(exp_field), subnormal, normal)
    out = magnitude | sign
    if fmt.inf_code is not None:
        out = _bits.select(_bits.zero_mask((c & 0x7F) ^ fmt.inf_code), _bits.INF_BITS | sign, out)
    if fmt.nan_codes:
        nan = torch.zeros_like(c)
        for code in fmt.nan_codes:
            nan = nan | _bits.zero_mask(c ^ code)
        out = _bits.select(nan, _bits.NAN_F32, out)
    return _bits.from_bits(out)


_FP4_PAIR_TABLES: dict = {}  # (format, device) -> (256,) int64, filled in eager mode only
_FP4_ENCODE_TABLES: dict = {}  # (format, device) -> (4096,) uint8, filled in eager mode only


def _byte_pairs(fmt: lowp.Format, device: torch.device) -> torch.Tensor:
    """(256, 2) float32: the values of the two float4 codes each byte packs."""
    every_byte = torch.arange(256, dtype=torch.int32, device=device).unsqueeze(-1)
    return _decode_computed(_layouts.unpack_fp4(every_byte), fmt)


def decode_fp4_packed(packed: torch.Tensor, fmt: lowp.Format) -> torch.Tensor:
    """float32 values of packed float4 codes (uint8, two a byte, element 2j in bits 3..0),
    last axis doubled: `decode(unpack_fp4(packed))` read from a 256-row table of byte ->
    value pair, itself built by `decode`, so every value is decode's to the bit.

    One gather instead of the unpack and the integer decode's passes over each element.
    """
    out_shape = tuple(packed.shape[:-1]) + (packed.shape[-1] * 2,)
    if _storage.traced(packed):
        return _byte_pairs(fmt, packed.device)[packed.to(torch.int64)].reshape(out_shape)
    table = _FP4_PAIR_TABLES.get((fmt.name, packed.device))
    if table is None:
        # each row's value pair as one int64, so that the gather moves one item a byte
        table = _byte_pairs(fmt, packed.device).view(torch.int64).reshape(256)
        _FP4_PAIR_TABLES[(fmt.name, packed.device)] = table
    # index_select reads a flat table 7-10x faster than advanced indexing on the CPU
    pairs = torch.index_select(table, 0, packed.reshape(-1).to(torch.int32))
    return pairs.view(torch.float32).reshape(out_shape)


# Computed when the module loads, not when `encode` first runs: under torch.compile that
# first run is traced, and the keys come from a float tensor's `tolist()`.
_MIDPOINT_KEYS = {
    name: _midpoint_keys(fmt)
    for name, fmt in lowp.ELEMENT_FORMATS.items()
    if fmt.ebits + fmt.mbits <= 3
}
