"""Tier (a): the reference quantize/dequantize, byte for byte.

Random data over ranks 1-4 against the independent oracle in tests/oracle.py, and
hand-derived bytes for the edge cases of spec §3 and §6.
"""

import dataclasses

import ml_dtypes
import numpy as np
import oracle
import pytest

import lowp

ELEMENTS = list(lowp.ELEMENT_FORMATS)
NAN32 = 0x7FC00000


def schemes_for_rank(rank):
    """Every scheme x element format the reference admits, for inputs of `rank`."""
    out = []
    for fmt in ELEMENTS:
        out += [lowp.TensorScaling(fmt), lowp.TensorScaling(fmt, pow2=True)]
        out += [lowp.AxisScaling(fmt, axis=-1), lowp.AxisScaling(fmt, axis=0, pow2=True)]
        if rank >= 2:
            out += [
                lowp.BlockScaling(fmt, block=(2, 4)),
                lowp.BlockScaling(fmt, block=(3, 5), pow2=True),
            ]
        for mode in ("floor", "ceil", "rceil"):
            out.append(lowp.MXScaling(fmt, block=8, mode=mode))
        if fmt != "float4_e2m1fn" and rank >= 2:
            out.append(lowp.MXScaling(fmt, block=2, mode="rceil", axis=0))
    out += [lowp.NVFP4Scaling(block=8), lowp.NVFP4Scaling(block=8, global_scale=False)]
    return out


SHAPES = {1: (48,), 2: (6, 16), 3: (2, 4, 8), 4: (2, 2, 3, 8)}
CASES = [(rank, s) for rank in SHAPES for s in schemes_for_rank(rank)]


def random_input(shape, seed):
    """Normal data across magnitudes per row, with exact zeros and signed small values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, size=shape[:-1] + (1,))
    x[rng.random(shape) < 0.05] = 0.0
    return x.astype(np.float32)


def unpacked_codes(q):
    return lowp.unpack_fp4(q.codes) if q.scheme.fmt == "float4_e2m1fn" else q.codes


@pytest.mark.parametrize("rank, scheme", CASES, ids=[f"r{r}-{s}" for r, s in CASES])
def test_random_data_matches_the_oracle(rank, scheme):
    x = random_input(SHAPES[rank], seed=rank)
    q = lowp.quantize(x, scheme)
    codes, scale, global_scale = oracle.quantize_nearest(x, scheme)
    np.testing.assert_array_equal(unpacked_codes(q), codes)
    np.testing.assert_array_equal(
        q.scale.reshape(-1).view(np.uint8), scale.reshape(-1).view(np.uint8)
    )
    if global_scale is None:
        assert q.global_scale is None
    else:
        assert q.global_scale.view(np.uint32) == np.float32(global_scale).view(np.uint32)
    assert q.shape == x.shape and q.hp_dtype == "float32"


@pytest.mark.parametrize("rank, scheme", CASES[::7], ids=[f"r{r}-{s}" for r, s in CASES[::7]])
def test_dequantize_is_within_half_a_step_of_the_input(rank, scheme):
    x = random_input(SHAPES[rank], seed=10 + rank)
    y = lowp.dequantize(lowp.quantize(x, scheme)).astype(np.float64)
    # Per element, the step of the format at the element's scaled value bounds the
    # error, except where the value saturated or flushed: check the bulk relatively.
    err = np.abs(y - x) / np.maximum(np.abs(x), 1e-30)
    mbits = lowp.FORMATS[scheme.fmt].mbits
    normal = np.abs(x) > np.max(np.abs(x)) * 2.0 ** -(mbits + 6)
    assert np.mean(err[normal] <= 2.0**-mbits) > 0.9


@pytest.mark.parametrize("hp", ["bfloat16", "float16"])
def test_bfloat16_and_float16_inputs_convert_exactly(hp):
    dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[hp]
    x = random_input((4, 32), seed=3).clip(-6e4, 6e4).astype(dtype)
    for scheme in (lowp.TensorScaling(), lowp.MXScaling(mode="rceil"), lowp.NVFP4Scaling()):
        q = lowp.quantize(x, scheme)
        ref = lowp.quantize(x.astype(np.float32), scheme)
        np.testing.assert_array_equal(q.codes, ref.codes)
        assert q.hp_dtype == hp
        out = lowp.dequantize(q)
        assert out.dtype == dtype
        np.testing.assert_array_equal(out, lowp.dequantize(ref).astype(dtype))


# --- hand-derived bytes ---------------------------------------------------------------


def test_tensorwise_e4m3_by_hand():
    x = np.array([1.0, -2.0, 448.0, 432.0, 0.0, -0.0], np.float32)
    q = lowp.quantize(x, lowp.TensorScaling())
    # amax 448: m = 1, d = 1. 432 is the tie between 416 (0x7D) and 448 (0x7E): even 0x7E.
    assert q.codes.tolist() == [0x38, 0xC0, 0x7E, 0x7E, 0x00, 0x80]
    assert q.scale.view(np.uint32) == np.float32(1.0).view(np.uint32)


def test_tensorwise_scale_is_the_reciprocal_of_the_rounded_multiplier():
    x = np.array([3.0, -1.0], np.float32)
    q = lowp.quantize(x, lowp.TensorScaling())
    m = np.float32(448) / np.float32(3)  # 149.33333 rounded once
    assert q.scale == np.float32(1) / m
    assert q.codes.tolist() == [
        0x7E,
        int(np.float32(-m).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)),
    ]


def test_pow2_clears_mantissa_bits_just_below_a_power_of_two():
    # amax slightly above 448/2**k makes m slightly below 2**k: pow2 must give 2**(k-1).
    amax = np.nextafter(np.float32(448) / np.float32(4), np.float32(np.inf))
    q = lowp.quantize(np.array([amax], np.float32), lowp.TensorScaling(pow2=True))
    assert q.scale == np.float32(0.5)  # m = 2, not 4 (torchao's exp2(floor(log2)) gives 4)
    exact = lowp.quantize(np.array([112.0], np.float32), lowp.TensorScaling(pow2=True))
    assert exact.scale == np.float32(0.25) and exact.codes.tolist() == [0x7E]


def test_all_zero_group_gets_the_eps_scale_and_zero_codes():
    assert lowp._quantize.EPS.view(np.uint32) == 0x2B8CBCCC
    q = lowp.quantize(np.zeros((2, 4), np.float32), lowp.AxisScaling())
    m = np.float32(448) / np.float32(1e-12)
    assert (q.codes == 0).all() and (q.scale == np.float32(1) / m).all()
    out = lowp.dequantize(q)
    assert (out == 0).all() and not np.isnan(out).any()


@pytest.mark.parametrize(
    "amax, mode, byte",
    [
        (448.0, "floor", 127),  # E=135, emax 8
        (464.0, "floor", 127),  # 464 saturates to 448 under floor
        (464.0, "ceil", 128),
        (464.0, "rceil", 128),  # 464/448 > 1
        (448.0, "ceil", 128),  # ceil of log2(448) = 9
        (448.0, "rceil", 127),  # exactly max: no step up
        (512.0, "floor", 128),
        (512.0, "ceil", 128),
        (512.0, "rceil", 128),
        (np.nextafter(np.float32(512), np.float32(0)), "floor", 127),
        (np.nextafter(np.float32(512), np.float32(0)), "ceil", 128),
        (np.nextafter(np.float32(512), np.float32(0)), "rceil", 128),
        (2.0**-120, "floor", 0),  # E(A) - emax < 0: byte 0 (2**-127)
        (0.0, "rceil", 0),
    ],
)
def test_mx_e4m3_scale_bytes_by_hand(amax, mode, byte):
    x = np.zeros(32, np.float32)
    x[5] = amax
    x[6] = -amax / 2
    q = lowp.quantize(x, lowp.MXScaling(mode=mode))
    assert q.scale.tolist() == [byte]


def test_mx_floor_saturates_and_rceil_halves():
    x = np.zeros(32, np.float32)
    x[0] = 464.0
    floor = lowp.quantize(x, lowp.MXScaling(mode="floor"))
    assert floor.codes[0] == 0x7E  # 464 clamped to 448 (ml_dtypes would give NaN)
    rceil = lowp.quantize(x, lowp.MXScaling(mode="rceil"))
    assert rceil.codes[0] == 0x76  # 232: tie between 224 (0x76, even) and 240
    assert lowp.dequantize(rceil)[0] == 448.0


def test_mx_byte_zero_dequantizes_without_a_subnormal_factor():
    x = np.zeros(32, np.float32)
    x[:3] = [2.0**-120, 2.0**-126, -(2.0**-125)]
    q = lowp.quantize(x, lowp.MXScaling(mode="floor"))
    assert q.scale.tolist() == [0]
    np.testing.assert_array_equal(lowp.dequantize(q)[:3], x[:3])


def test_nvfp4_without_global_scale_by_hand():
    x = np.array([6, 3, 1, 0.5, -6, -0.25, 0, 2] + [0] * 8 + [12, -3] + [0] * 14, np.float32)
    q = lowp.quantize(x, lowp.NVFP4Scaling(global_scale=False))
    # block 0: amax 6 -> sb = e4m3(6 * RN32(1/6)) = e4m3(1.0) = 0x38, inv 1
    # block 1: amax 12 -> sb = 2.0 = 0x40, elements halved: 6 -> 0x7, -1.5 -> 0xB
    assert q.scale.tolist() == [0x38, 0x40]
    codes = lowp.unpack_fp4(q.codes)
    assert codes[:8].tolist() == [0x7, 0x5, 0x2, 0x1, 0xF, 0x8, 0x0, 0x4]
    assert codes[16:18].tolist() == [0x7, 0xB]
    assert q.codes[0] == 0x57  # element 0 in bits 3..0, element 1 in bits 7..4
    assert q.global_scale is None


def test_nvfp4_global_scale_by_hand():
    x = np.zeros(32, np.float32)
    x[0], x[16] = 2688.0, 6.0
    q = lowp.quantize(x, lowp.NVFP4Scaling())
    # A = 2688: S_enc = 1, S_dec = 1; block 0 scale 448 (0x7E), block 1 scale 1 (0x38)
    assert q.global_scale == np.float32(1.0)
    assert q.scale.tolist() == [0x7E, 0x38]
    assert lowp.unpack_fp4(q.codes)[[0, 16]].tolist() == [0x7, 0x7]
    assert lowp.dequantize(q)[[0, 16]].tolist() == [2688.0, 6.0]


# --- non-finite, zero, empty (spec §6) ------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize(
    "scheme",
    [
        lowp.AxisScaling(),
        lowp.BlockScaling(block=(1, 4)),
        lowp.MXScaling(block=4),
        lowp.NVFP4Scaling(block=4, global_scale=False),
    ],
    ids=str,
)
def test_a_non_finite_element_poisons_only_its_group(bad, scheme):
    x = np.ones((2, 8), np.float32)
    clean = lowp.dequantize(lowp.quantize(x, scheme))
    x[0, 1] = bad
    q = lowp.quantize(x, scheme)
    out = lowp.dequantize(q)
    group_cols = 8 if isinstance(scheme, lowp.AxisScaling) else 4
    assert (out[0, :group_cols].view(np.uint32) == NAN32).all()
    np.testing.assert_array_equal(out[0, group_cols:], clean[0, group_cols:])
    np.testing.assert_array_equal(out[1], clean[1])
    codes = unpacked_codes(q)
    assert (codes[0, :group_cols] == 0).all()
    poisoned_scale = q.scale.reshape(-1)[0]
    if q.scale.dtype == np.float32:
        assert poisoned_scale.view(np.uint32) == NAN32
    else:
        assert poisoned_scale == (0xFF if isinstance(scheme, lowp.MXScaling) else 0x7F)


def test_nvfp4_with_global_scale_is_poisoned_whole():
    x = np.ones((2, 32), np.float32)
    x[1, 20] = np.inf
    q = lowp.quantize(x, lowp.NVFP4Scaling())
    assert q.global_scale.view(np.uint32) == NAN32
    assert (q.scale == 0x7F).all() and (q.codes == 0).all()
    assert (lowp.dequantize(q).view(np.uint32) == NAN32).all()


@pytest.mark.parametrize(
    "out_dtype, bits", [("float32", 0x7FC00000), ("bfloat16", 0x7FC0), ("float16", 0x7E00)]
)
def test_poisoned_groups_dequantize_to_the_canonical_nan(out_dtype, bits):
    x = np.array([1.0, np.nan], np.float32)
    out = lowp.dequantize(lowp.quantize(x, lowp.TensorScaling()), out_dtype)
    assert out.view(np.uint32 if out_dtype == "float32" else np.uint16).tolist() == [bits, bits]


def test_float32_subnormal_inputs_flush_keeping_their_sign():
    x = np.array([1e-40, -1e-40, 1.0], np.float32)
    q = lowp.quantize(x, lowp.TensorScaling())
    assert q.codes.tolist() == [0x00, 0x80, 0x7E]
    only_subnormal = lowp.quantize(x[:2], lowp.MXScaling(block=2))
    assert only_subnormal.scale.tolist() == [0] and only_subnormal.codes.tolist() == [0x00, 0x80]


@pytest.mark.parametrize("shape", [(0,), (0, 32), (4, 0), (2, 0, 32)])
@pytest.mark.parametrize(
    "scheme",
    [lowp.TensorScaling(), lowp.AxisScaling(), lowp.MXScaling(), lowp.NVFP4Scaling()],
    ids=str,
)
def test_empty_tensors(shape, scheme):
    q = lowp.quantize(np.zeros(shape, np.float32), scheme)
    assert unpacked_codes(q).shape == shape and q.scale.shape == scheme.scale_shape(shape)
    assert lowp.dequantize(q).shape == shape
    if isinstance(scheme, lowp.NVFP4Scaling):
        assert q.global_scale == 1.0


def test_check_finite_names_the_tensor():
    x = np.ones(4, np.float32)
    x[2] = np.inf
    with pytest.raises(FloatingPointError, match=r"layer1.weight.*index \(2,\)"):
        lowp.quantize(x, lowp.TensorScaling(), check_finite=True, name="layer1.weight")


# --- stochastic rounding (spec §4) ----------------------------------------------------


def test_random_bits_follow_the_hash():
    got = lowp.random_bits(1234, (2, 3), offset=2**32 + 7)
    want = [oracle.hash_bits(1234, i, 7) for i in range(6)]
    assert got.dtype == np.uint32 and got.reshape(-1).tolist() == want
    assert lowp.random_bits(-1, (1,)).tolist() == [oracle.hash_bits(2**32 - 1, 0)]


@pytest.mark.parametrize("fmt", ELEMENTS)
def test_stochastic_codes_match_exact_rationals(fmt):
    rng = np.random.default_rng(7)
    top = lowp.FORMATS[fmt].max
    x = (rng.standard_normal(256) * top / 3).astype(np.float32)
    x[:4] = [0.0, -0.0, top, -top]
    r = rng.integers(0, 2**32, size=x.shape, dtype=np.uint32)
    q = lowp.quantize(
        x, lowp.MXScaling(fmt, block=256, mode="rceil"), rounding="stochastic", random_bits=r
    )
    s = int(q.scale[0])
    scaled = [float(np.float32(v * np.float32(2.0 ** (127 - s)))) for v in x]
    want = [
        oracle.cast_code(oracle.stochastic_value(v, fmt, int(ri)), fmt)
        for v, ri in zip(scaled, r, strict=True)
    ]
    assert unpacked_codes(q).tolist() == want


@pytest.mark.parametrize("fmt", ELEMENTS)
def test_stochastic_codes_match_exact_rationals_at_every_threshold(fmt):
    """The integer element step (`lowp._rounding.stochastic_codes`) against spec §4.1
    in exact rationals, on the encoder's hard cases of every binade (kept mantissas,
    ties and the patterns around them, the subnormal grid), each with the random bits
    just below and at the value where it starts to round up, and at both extremes."""
    from fractions import Fraction

    from lowp import _rounding
    from tests.test_chunked import _rounding_cases

    spec = lowp.FORMATS[fmt]
    v = _rounding_cases(spec)[::37]  # every 37th: the rationals are slow
    values, bits = [], []
    for x in v:
        a = Fraction(abs(float(x)))
        e = 1 - spec.bias if a == 0 else max(int(np.frexp(abs(x))[1]) - 1, 1 - spec.bias)
        t = a * Fraction(2) ** (spec.mbits - e)
        fraction24 = int((t - int(t)) * 2**24)
        threshold = ((2**24 - fraction24) << 8) & 0xFFFFFFFF if fraction24 else None
        for r in (0, 0xFFFFFFFF) + (() if threshold is None else (threshold - 1, threshold)):
            values.append(x)
            bits.append(r)
    x = np.array(values, np.float32)
    r = np.array(bits, np.uint32)
    got = _rounding.stochastic_codes(x, spec, r, _rounding.Scratch())
    want = [
        oracle.cast_code(oracle.stochastic_value(float(xi), fmt, int(ri)), fmt)
        for xi, ri in zip(x, r, strict=True)
    ]
    assert got.tolist() == want


def test_stochastic_extremes_truncate_or_round_away():
    x = np.array([1.1, -1.1, 1.0], np.float32)  # e4m3 grid near 1: 1.0, 1.125
    down = lowp.quantize(
        x, lowp.MXScaling(block=3), rounding="stochastic", random_bits=np.zeros(3, np.uint32)
    )
    up = lowp.quantize(
        x,
        lowp.MXScaling(block=3),
        rounding="stochastic",
        random_bits=np.full(3, 2**32 - 1, np.uint32),
    )
    assert lowp.dequantize(down).tolist() == [1.0, -1.0, 1.0]
    assert lowp.dequantize(up).tolist() == [1.125, -1.125, 1.0]


def test_stochastic_rounding_is_unbiased():
    x = np.full(200_000, 1.1, np.float32)
    q = lowp.quantize(x, lowp.TensorScaling(), rounding="stochastic", seed=0)
    mean = lowp.dequantize(q).astype(np.float64).mean()
    target = float(np.float32(1.1)) * float(q.scale) / float(q.scale)
    assert abs(mean - target) < 2e-3, mean


def test_seed_and_offset_are_reproducible_and_distinct():
    x = random_input((4, 64), seed=1)
    a = lowp.quantize(x, lowp.AxisScaling(), rounding="stochastic", seed=5)
    b = lowp.quantize(x, lowp.AxisScaling(), rounding="stochastic", seed=5)
    c = lowp.quantize(x, lowp.AxisScaling(), rounding="stochastic", seed=5, offset=1)
    np.testing.assert_array_equal(a.codes, b.codes)
    assert not np.array_equal(a.codes, c.codes)
    explicit = lowp.quantize(
        x, lowp.AxisScaling(), rounding="stochastic", random_bits=lowp.random_bits(5, x.shape)
    )
    np.testing.assert_array_equal(a.codes, explicit.codes)


# --- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, error, match",
    [
        (np.ones(4, np.float64), TypeError, "float64"),
        (np.ones(4, np.int32), TypeError, "int32"),
        (np.ones(4, bool), TypeError, "bool"),
        (np.ones(4, np.complex64), TypeError, "complex64"),
        ([1.0, 2.0], TypeError, "list"),
    ],
)
def test_bad_input_types(x, error, match):
    with pytest.raises(error, match=match):
        lowp.quantize(x, lowp.TensorScaling())


@pytest.mark.parametrize(
    "shape, scheme, match",
    [
        ((4, 8), lowp.AxisScaling(axis=2), "axis 2"),
        ((8,), lowp.BlockScaling(), "rank >= 2"),
        ((4, 30), lowp.MXScaling(), "block 32 does not divide axis -1 of size 30"),
        ((4, 6), lowp.TensorScaling("float4_e2m1fn"), None),
        ((4, 5), lowp.TensorScaling("float4_e2m1fn"), "even"),
        ((32, 4), lowp.MXScaling("float4_e2m1fn", axis=0), "last axis"),
        ((), lowp.MXScaling(), "rank >= 1"),
        ((4, 48), lowp.NVFP4Scaling(axis=0), "block 16 does not divide axis 0 of size 4"),
    ],
)
def test_bad_shapes_name_the_offending_value(shape, scheme, match):
    x = np.ones(shape, np.float32)
    if match is None:
        assert lowp.quantize(x, scheme).codes.shape == (4, 3)
        return
    with pytest.raises(ValueError, match=match):
        lowp.quantize(x, scheme)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"rounding": "up"}, ValueError, "'up'"),
        ({"seed": 1}, ValueError, "stochastic"),
        ({"rounding": "stochastic"}, ValueError, "exactly one"),
        (
            {"rounding": "stochastic", "seed": 1, "random_bits": np.zeros(4, np.uint32)},
            ValueError,
            "exactly one",
        ),
        ({"rounding": "stochastic", "random_bits": np.zeros(3, np.uint32)}, ValueError, r"\(3,\)"),
        ({"rounding": "stochastic", "random_bits": np.zeros(4, np.int64)}, TypeError, "uint32"),
        ({"rounding": "stochastic", "seed": 1.5}, TypeError, "1.5"),
    ],
)
def test_bad_rounding_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        lowp.quantize(np.ones(4, np.float32), lowp.TensorScaling(), **kwargs)


def test_dequantize_checks_its_arguments():
    q = lowp.quantize(np.ones(4, np.float32), lowp.TensorScaling())
    with pytest.raises(ValueError, match="float64"):
        lowp.dequantize(q, "float64")
    with pytest.raises(TypeError, match="QTensor"):
        lowp.dequantize(np.ones(4, np.float32))


def test_qtensor_refuses_inconsistent_fields():
    q = lowp.quantize(np.ones((4, 32), np.float32), lowp.MXScaling())
    with pytest.raises(ValueError, match="scale must have shape"):
        dataclasses.replace(q, scale=np.zeros((4, 2), np.uint8))
    with pytest.raises(TypeError, match="codes must be uint8"):
        dataclasses.replace(q, codes=q.codes.astype(np.int8))
    with pytest.raises(ValueError, match="hp_dtype"):
        dataclasses.replace(q, hp_dtype="float64")
    with pytest.raises(ValueError, match="global_scale must be None"):
        dataclasses.replace(q, global_scale=np.float32(1).reshape(()))


def test_quantize_does_not_mutate_its_input():
    x = random_input((4, 32), seed=2)
    x[0, 0] = np.nan
    before = x.copy()
    lowp.quantize(x, lowp.MXScaling(), rounding="stochastic", seed=1)
    np.testing.assert_array_equal(x.view(np.uint32), before.view(np.uint32))


@pytest.mark.parametrize(
    "scheme", [lowp.TensorScaling(pow2=True), lowp.MXScaling(block=1, mode="ceil")], ids=str
)
def test_inputs_near_flt_max_may_dequantize_to_inf_without_a_warning(scheme):
    """The scale rounded up past max/amax: value(code) * scale exceeds FLT_MAX (spec §3)."""
    x = np.array([np.finfo(np.float32).max], np.float32)
    out = lowp.dequantize(lowp.quantize(x, scheme))  # RuntimeWarnings are errors in this suite
    assert out[0] == np.inf
