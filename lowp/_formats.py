"""The low-precision formats: metadata, the integer encoder of spec §2, and decoders.

Each element format is a sign bit, `ebits` exponent bits with `bias`, and `mbits`
mantissa bits, with subnormals. The `fn` formats have no Inf; e4m3fn's only NaN is
S.1111.111; float6/float4 have neither. e5m2 is IEEE-like (Inf, three NaN mantissas).
"""

import dataclasses
import functools

import numpy as np

from lowp import _bits


@dataclasses.dataclass(frozen=True)
class Format:
    """One low-precision floating-point format.

    Attributes:
      name: the ml_dtypes spelling, e.g. "float8_e4m3fn".
      ebits, mbits: exponent and mantissa field widths (no sign bit for e8m0).
      bias: exponent bias.
      max: largest finite value.
      max_mantissa: `Mc` of spec §3.2, the float32 mantissa field of `max`.
      min_normal, min_subnormal: smallest positive normal and subnormal (0 if none).
      emax: the MX `emax`, the unbiased exponent of `max` (None for scale-only formats).
      nan_codes: codes that mean NaN (both signs).
      inf_code: the code of +Inf, or None.
      signed: False only for e8m0.
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max: float
    max_mantissa: int
    min_normal: float
    min_subnormal: float
    emax: int | None
    nan_codes: tuple[int, ...]
    inf_code: int | None
    signed: bool = True

    @property
    def bits(self) -> int:
        """The code's width: sign, exponent and mantissa bits (8, 6 or 4)."""
        return int(self.signed) + self.ebits + self.mbits

    @property
    def max_code(self) -> int:
        """The positive code of `max`."""
        return int(encode(np.array([self.max], dtype=np.float32), self)[0])

    def values(self) -> np.ndarray:
        """float32 value of every code 0 .. 2**bits - 1 (NaN codes give NaN)."""
        return _value_table(self)


def _element(name, ebits, mbits, nan_codes, inf_code=None, ieee_top=False):
    bias = (1 << (ebits - 1)) - 1
    top_exponent = (1 << ebits) - 1 - bias - (1 if ieee_top else 0)
    if nan_codes and not ieee_top:  # e4m3fn: top exponent kept, all-ones mantissa is NaN
        top_mantissa = (1 << mbits) - 2
    else:
        top_mantissa = (1 << mbits) - 1
    max_value = 2.0**top_exponent * (1 + top_mantissa / 2**mbits)
    return Format(
        name=name,
        ebits=ebits,
        mbits=mbits,
        bias=bias,
        max=max_value,
        max_mantissa=top_mantissa << (23 - mbits),
        min_normal=2.0 ** (1 - bias),
        min_subnormal=2.0 ** (1 - bias - mbits),
        emax=top_exponent,
        nan_codes=nan_codes,
        inf_code=inf_code,
    )


FLOAT8_E4M3FN = _element("float8_e4m3fn", 4, 3, (0x7F, 0xFF))
FLOAT8_E5M2 = _element(
    "float8_e5m2", 5, 2, (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF), inf_code=0x7C, ieee_top=True
)
FLOAT6_E2M3FN = _element("float6_e2m3fn", 2, 3, ())
FLOAT6_E3M2FN = _element("float6_e3m2fn", 3, 2, ())
FLOAT4_E2M1FN = _element("float4_e2m1fn", 2, 1, ())
FLOAT8_E8M0FNU = Format(
    name="float8_e8m0fnu",
    ebits=8,
    mbits=0,
    bias=127,
    max=2.0**127,
    max_mantissa=0,
    min_normal=2.0**-127,
    min_subnormal=0.0,
    emax=None,
    nan_codes=(0xFF,),
    inf_code=None,
    signed=False,
)

ELEMENT_FORMATS = {
    f.name: f for f in (FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT6_E2M3FN, FLOAT6_E3M2FN, FLOAT4_E2M1FN)
}
SCALE_FORMATS = ("float32", "float8_e8m0fnu", "float8_e4m3fn")
FORMATS = {**ELEMENT_FORMATS, FLOAT8_E8M0FNU.name: FLOAT8_E8M0FNU}


def element_format(name: str) -> Format:
    """The element format called `name`; ValueError naming it if there is none."""
    if not isinstance(name, str) or name not in ELEMENT_FORMATS:
        raise ValueError(
            f"unknown element format {name!r}; expected one of {sorted(ELEMENT_FORMATS)}"
        )
    return ELEMENT_FORMATS[name]


def encode(v: np.ndarray, fmt: Format) -> np.ndarray:
    """E_fmt of spec §2: float32 -> uint8 codes, round to nearest, ties to even code.

    `v` is a float32 array, finite with |v| <= fmt.max (`quantize` clamps first);
    subnormals of the element format are produced, float32 subnormals round to a signed
    zero, and the sign bit of `v` is kept (-0.0 -> sign set). Integer arithmetic only.

    Raises:
      TypeError: `v` is not float32 (a float64 value would round twice, spec §0.1), or
        `fmt` is not a Format (a name: look it up in `lowp.FORMATS`).
      ValueError: naming the first value that is not finite or above fmt.max in
        magnitude (the encoder would wrap it into another code).
    """
    _check_format("encode", fmt)
    v = np.asarray(v)
    if v.dtype != np.float32:
        raise TypeError(f"encode takes float32 values, got dtype {v.dtype}; cast first")
    outside = (_bits.bits(v) & _bits.ABS) > _bits.bits(np.float32(fmt.max))
    if outside.any():
        first = v.reshape(-1)[np.argmax(outside.reshape(-1))]
        raise ValueError(
            f"encode: {first!r} is not a finite value of magnitude <= {fmt.name}'s max "
            f"{fmt.max:g}; clamp (and poison) first, as quantize does"
        )
    return encode_in_range(v, fmt)


def encode_in_range(v: np.ndarray, fmt: Format) -> np.ndarray:
    """`encode` without its checks, for callers that clamp first (quantize, rounding)."""
    b = _bits.bits(v)
    sign = (b >> np.uint32(31)).astype(np.uint32)
    e32 = ((b >> np.uint32(23)) & np.uint32(0xFF)).astype(np.int32)
    mant = b & _bits.MANT_MASK
    # 24-bit significand; a float32 subnormal has no implicit bit and exponent 1.
    sig = np.where(e32 > 0, mant | np.uint32(1 << 23), mant)
    unbiased = np.maximum(e32, 1) - 127
    target_exp = unbiased + fmt.bias  # biased exponent in the target format
    field = np.maximum(target_exp, 1)  # subnormals share the exponent of min normal
    # Bits of `sig` dropped: the mantissa narrowing plus the subnormal shift. A shift
    # of 25 or more leaves nothing and a remainder below half, so it is capped there.
    shift = np.minimum(23 - fmt.mbits + (field - target_exp), 25).astype(np.uint32)
    kept = sig >> shift
    rest = sig & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    round_up = (rest > half) | ((rest == half) & ((kept & np.uint32(1)) == 1))
    # `kept` carries the implicit bit at position mbits for normals, so the exponent
    # field is added as (field - 1); a mantissa carry rolls into the exponent.
    magnitude = ((field - 1).astype(np.uint32) << np.uint32(fmt.mbits)) + kept + round_up
    code = (sign << np.uint32(fmt.ebits + fmt.mbits)) | magnitude
    return code.astype(np.uint8)


@functools.cache
def _value_table(fmt: Format) -> np.ndarray:
    codes = np.arange(1 << fmt.bits, dtype=np.int64)
    if not fmt.signed:  # e8m0: the byte is the biased exponent, 0xFF is NaN
        values = np.ldexp(1.0, np.minimum(codes, 254) - fmt.bias)  # 0xFF: NaN, set below
    else:
        sign = np.where(codes >> (fmt.ebits + fmt.mbits) & 1, -1.0, 1.0)
        exp_field = (codes >> fmt.mbits) & ((1 << fmt.ebits) - 1)
        mant = codes & ((1 << fmt.mbits) - 1)
        normal = exp_field > 0
        significand = np.where(normal, 1.0 + mant / 2.0**fmt.mbits, mant / 2.0**fmt.mbits)
        values = sign * np.ldexp(significand, np.where(normal, exp_field, 1) - fmt.bias)
        if fmt.inf_code is not None:
            half = 1 << (fmt.ebits + fmt.mbits)
            values[fmt.inf_code] = np.inf
            values[fmt.inf_code | half] = -np.inf
    values = values.astype(np.float32)  # every value is exact in float32
    nan_bits = _bits.from_bits(np.full(len(fmt.nan_codes), _bits.NAN_F32))
    values[list(fmt.nan_codes)] = nan_bits
    values.flags.writeable = False
    return values


def decode(codes: np.ndarray, fmt: Format) -> np.ndarray:
    """float32 value of each code (one code per uint8, unpacked); ValueError naming a
    byte that is no code of `fmt` (above 15 for fp4, 63 for fp6). TypeError for codes
    that are not uint8: casting them would wrap 300 to 44 or -1 to 255, another code."""
    _check_format("decode", fmt)
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"decode takes uint8 codes, got dtype {codes.dtype}")
    if fmt.bits < 8 and codes.size and codes.max() >> fmt.bits:
        raise ValueError(f"decode: {int(codes.max())} is not a {fmt.bits}-bit {fmt.name} code")
    return _value_table(fmt)[codes]


def _check_format(caller: str, fmt) -> None:
    if not isinstance(fmt, Format):
        hint = f"lowp.FORMATS[{fmt!r}]" if isinstance(fmt, str) else "a value of lowp.FORMATS"
        raise TypeError(f"{caller} takes a lowp.Format ({hint}), got {_short(fmt)}")


def _short(value: object, limit: int = 200) -> str:
    """repr(value) cut to `limit` characters: an error message never echoes a huge input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
