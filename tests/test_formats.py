"""Tier (a): the element encoder and decoders, exhaustively, against ml_dtypes."""

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp import _formats

ELEMENTS = list(lowp.ELEMENT_FORMATS)
DTYPES = {name: getattr(ml_dtypes, name) for name in ELEMENTS}


def finite_codes(fmt):
    values = fmt.values()
    codes = np.arange(1 << fmt.bits, dtype=np.uint8)
    return codes[np.isfinite(values)]


@pytest.mark.parametrize(
    "name, bits, bias, max_value, mc, min_normal, min_sub, emax",
    [
        ("float8_e4m3fn", 8, 7, 448.0, 0x600000, 2.0**-6, 2.0**-9, 8),
        ("float8_e5m2", 8, 15, 57344.0, 0x600000, 2.0**-14, 2.0**-16, 15),
        ("float6_e2m3fn", 6, 1, 7.5, 0x700000, 1.0, 0.125, 2),
        ("float6_e3m2fn", 6, 3, 28.0, 0x600000, 0.25, 0.0625, 4),
        ("float4_e2m1fn", 4, 1, 6.0, 0x400000, 1.0, 0.5, 2),
    ],
)
def test_metadata_matches_the_spec_table(
    name, bits, bias, max_value, mc, min_normal, min_sub, emax
):
    fmt = lowp.FORMATS[name]
    assert (fmt.bits, fmt.bias, fmt.max, fmt.max_mantissa) == (bits, bias, max_value, mc)
    assert (fmt.min_normal, fmt.min_subnormal, fmt.emax) == (min_normal, min_sub, emax)
    finfo = ml_dtypes.finfo(DTYPES[name])
    assert float(finfo.max) == fmt.max
    assert float(finfo.smallest_normal) == fmt.min_normal
    assert float(finfo.smallest_subnormal) == fmt.min_subnormal


def test_nan_and_inf_codes():
    assert lowp.FORMATS["float8_e4m3fn"].nan_codes == (0x7F, 0xFF)
    assert lowp.FORMATS["float8_e5m2"].nan_codes == (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF)
    assert lowp.FORMATS["float8_e5m2"].inf_code == 0x7C
    for name in ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"):
        assert lowp.FORMATS[name].nan_codes == () and lowp.FORMATS[name].inf_code is None


@pytest.mark.parametrize("name", list(lowp.FORMATS))
def test_decode_every_code_matches_ml_dtypes(name):
    fmt = lowp.FORMATS[name]
    ours = lowp.decode(np.arange(1 << fmt.bits, dtype=np.uint8), fmt)
    theirs = (
        np.arange(1 << fmt.bits, dtype=np.uint8).view(getattr(ml_dtypes, name)).astype(np.float32)
    )
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    ok = ~np.isnan(theirs)
    np.testing.assert_array_equal(ours[ok].view(np.uint32), theirs[ok].view(np.uint32))
    assert (ours[np.isnan(ours)].view(np.uint32) == 0x7FC00000).all()  # canonical NaN


@pytest.mark.parametrize("name", ELEMENTS)
def test_every_code_round_trips(name):
    fmt = lowp.FORMATS[name]
    codes = finite_codes(fmt)
    non_finite = len(fmt.nan_codes) + (2 if fmt.inf_code is not None else 0)
    assert len(codes) == (1 << fmt.bits) - non_finite
    np.testing.assert_array_equal(lowp.encode(lowp.decode(codes, fmt), fmt), codes)


@pytest.mark.parametrize("name", ELEMENTS)
def test_midpoints_round_to_even_on_both_sides(name):
    """Every float32 midpoint between adjacent codes, and +-1, +-2 ulp around it."""
    fmt = lowp.FORMATS[name]
    positive = np.arange(0, fmt.max_code + 1, dtype=np.uint8)
    values = lowp.decode(positive, fmt).astype(np.float64)
    lower, upper = values[:-1], values[1:]
    mid = ((lower + upper) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (lower + upper) / 2)  # midpoints are exact
    even = np.where(positive[:-1] % 2 == 0, positive[:-1], positive[1:])
    checks = {0: even}
    for steps, expect in (
        (1, positive[1:]),
        (2, positive[1:]),
        (-1, positive[:-1]),
        (-2, positive[:-1]),
    ):
        checks[steps] = expect
    sign = np.uint8(1 << (fmt.bits - 1))
    for steps, expect in checks.items():
        probe = (mid.view(np.uint32).astype(np.int64) + steps).astype(np.uint32).view(np.float32)
        np.testing.assert_array_equal(lowp.encode(probe, fmt), expect, err_msg=f"{steps} ulp")
        np.testing.assert_array_equal(
            lowp.encode(-probe, fmt), expect | sign, err_msg=f"-, {steps} ulp"
        )


@pytest.mark.slow
@pytest.mark.parametrize("name", ELEMENTS)
def test_encoder_equals_ml_dtypes_on_a_dense_sweep(name):
    """Every 61st float32 pattern in [0, max] (about 18M values for e4m3), both signs."""
    fmt = lowp.FORMATS[name]
    top = int(np.float32(fmt.max).view(np.uint32))
    patterns = np.arange(0, top + 1, 61, dtype=np.uint32)
    patterns = np.concatenate([patterns, patterns | np.uint32(0x80000000)])
    x = patterns.view(np.float32)
    want = x.astype(DTYPES[name]).view(np.uint8)
    np.testing.assert_array_equal(lowp.encode(x, fmt), want)


def test_signed_zero_and_float32_subnormals():
    e4m3 = lowp.FORMATS["float8_e4m3fn"]
    x = np.array([0.0, -0.0, 1e-40, -1e-40, 2.0**-10, -(2.0**-10)], np.float32)
    # 2**-10 is the tie between 0 and the smallest subnormal 2**-9: even code 0.
    assert lowp.encode(x, e4m3).tolist() == [0x00, 0x80, 0x00, 0x80, 0x00, 0x80]


def test_max_code_and_values_are_read_only():
    assert [lowp.FORMATS[n].max_code for n in ELEMENTS] == [0x7E, 0x7B, 0x1F, 0x1F, 0x07]
    with pytest.raises(ValueError):
        lowp.FORMATS["float8_e4m3fn"].values()[0] = 1.0


def test_element_format_names_the_unknown_one():
    with pytest.raises(ValueError, match="float8_e4m3"):
        _formats.element_format("float8_e4m3")


def test_encode_refuses_what_it_would_wrap():
    """Outside [-max, max] the integer encoder would wrap into another code (e4m3 500
    would read -0): encode names the value; float64 would round twice (spec §0.1)."""
    e4m3 = lowp.FORMATS["float8_e4m3fn"]
    for bad in (500.0, -449.0, np.inf, np.nan):
        with pytest.raises(ValueError, match="not a finite value of magnitude <= float8_e4m3fn"):
            lowp.encode(np.array([1.0, bad], np.float32), e4m3)
    with pytest.raises(TypeError, match="float32 values, got dtype float64"):
        lowp.encode(np.array([1.0]), e4m3)
    assert lowp.encode(np.array([448.0, -448.0], np.float32), e4m3).tolist() == [0x7E, 0xFE]


def test_codes_and_shapes_outside_their_range_are_named():
    fp4 = lowp.FORMATS["float4_e2m1fn"]
    with pytest.raises(ValueError, match="20 is not a 4-bit float4_e2m1fn code"):
        lowp.decode(np.array([3, 20], np.uint8), fp4)
    with pytest.raises(ValueError, match="17 is not a 4-bit code"):
        lowp.pack_fp4(np.array([17, 2], np.uint8))
    with pytest.raises(TypeError, match="uint8 codes, got dtype int64"):
        lowp.pack_fp4(np.array([1, 2]))
    with pytest.raises(ValueError, match="rank >= 1"):
        lowp.unpack_fp4(np.array(5, np.uint8))
    for shape in ((3, -1), (2.7, 3), True):
        with pytest.raises(ValueError, match="shape must be non-negative ints"):
            lowp.random_bits(0, shape)
    assert lowp.random_bits(0, 3).shape == (3,)
    from lowp._schemes import from_spec

    with pytest.raises(ValueError, match="'mode' given twice"):
        from_spec("mx:mode=ceil:mode=floor")
