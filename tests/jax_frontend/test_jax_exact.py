"""lowp_jax's exact building blocks against NumPy, bit for bit, over large samples.

The correctly rounded divide (spec §0.4) on 1M random pairs of every exponent plus the
boundaries where rounding, flushing and overflow meet; the narrow multiply on products
that straddle the flush boundary (where XLA on CPU and IEEE disagree); the element
encoder, stochastic rounding, random bits and the float16/bfloat16 conversions.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax_cases import divide_pairs, ftz, random_f32, reference_divide

import lowp
import lowp_jax
from lowp import _rounding as np_rounding
from lowp_jax import _dtypes, _encode, _exact
from lowp_jax import _rounding as jax_rounding

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered", "ignore:invalid value", "ignore:divide by zero"
)


def assert_same_bits(got, want, *inputs):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    both_nan = np.isnan(got) & np.isnan(want)
    diff = np.flatnonzero((got.view(np.uint32) != want.view(np.uint32)) & ~both_nan)
    if diff.size:
        i = diff[0]
        operands = ", ".join(f"0x{int(np.float32(a[i]).view(np.uint32)):08X}" for a in inputs)
        raise AssertionError(
            f"{diff.size} of {got.size} differ; first at {i}: operands {operands}: "
            f"lowp_jax 0x{int(got.view(np.uint32)[i]):08X}, "
            f"NumPy 0x{int(want.view(np.uint32)[i]):08X}"
        )
    assert (got.view(np.uint32)[np.isnan(got)] == 0x7FC00000).all()  # canonical NaN


def test_div_rn_matches_numpy_on_a_million_pairs():
    a, b = divide_pairs(np.random.default_rng(0), 1_000_000)
    assert_same_bits(jax.jit(_exact.div_rn)(a, b), reference_divide(a, b), a, b)


def test_div_rn_survives_constant_folding_and_chains():
    # XLA rewrites x / const into x * RN32(1/const) and 1/(448/a) into a * RN32(1/448)
    # (spec §0.4, §0.6); the integer divide leaves it nothing to rewrite.
    a = np.abs(ftz(random_f32(np.random.default_rng(1), 100_000)))
    a = np.where(np.isfinite(a) & (a > 0), a, np.float32(3))
    m = jax.jit(lambda a: _exact.div_rn(np.float32(448), a))(a)
    d = jax.jit(lambda a: _exact.div_rn(np.float32(1), _exact.div_rn(np.float32(448), a)))(a)
    by_const = jax.jit(lambda a: _exact.div_rn(a, np.float32(448)))(a)
    with np.errstate(all="ignore"):
        want_m = ftz(np.float32(448) / a)
        assert_same_bits(m, want_m, a)
        assert_same_bits(d, ftz(np.float32(1) / want_m), a)
        assert_same_bits(by_const, ftz(a / np.float32(448)), a)


def test_mul_narrow_is_exact_where_the_cpu_flush_is_not():
    rng = np.random.default_rng(2)
    n = 500_000
    values = np.concatenate(
        [lowp.FORMATS[f].values() for f in lowp.ELEMENT_FORMATS]
        + [lowp.FORMATS["float8_e4m3fn"].values()]
    )
    a = rng.choice(values, n).astype(np.float32)
    b = random_f32(rng, n)
    # Half the products land within a few ulps of 2**-126, the band where XLA on CPU
    # flushes what IEEE rounds up to the smallest normal.
    h = n // 2
    with np.errstate(all="ignore"):
        target = (
            np.float64(2.0**-126) / np.where(np.isfinite(a[:h]) & (a[:h] != 0), np.abs(a[:h]), 1)
        ).astype(np.float32)
    b[:h] = (
        (target.view(np.uint32).astype(np.int64) + rng.integers(-3, 4, h))
        .clip(0, 0x7F7FFFFF)
        .astype(np.uint32)
        .view(np.float32)
    )
    got = jax.jit(_exact.mul_narrow)(a, b)
    with np.errstate(all="ignore"):
        want = ftz(np.multiply(ftz(a), ftz(b), dtype=np.float32))
    assert_same_bits(got, want, a, b)


@pytest.mark.parametrize("fmt", list(lowp.ELEMENT_FORMATS))
def test_encoder_matches_lowp(fmt):
    f = lowp.FORMATS[fmt]
    rng = np.random.default_rng(3)
    values = np.abs(f.values()[np.isfinite(f.values())]).astype(np.float32)
    values = np.unique(values)
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)
    near = np.concatenate(
        [np.nextafter(mids, np.float32(0)), mids, np.nextafter(mids, np.float32(np.inf))]
    )
    sample = np.concatenate(
        [
            values,
            near,
            rng.uniform(-f.max, f.max, 1_000_000).astype(np.float32),
            random_f32(rng, 100_000) * np.float32(0),  # zeros of both signs
            (
                rng.integers(0, 2**23, 100_000, dtype=np.uint32)
                | np.uint32(0x80000000) * rng.integers(0, 2, 100_000, dtype=np.uint32)
            ).view(np.float32),  # float32 subnormals
        ]
    )
    sample = np.concatenate([sample, -sample]).astype(np.float32)
    sample = sample[np.abs(sample) <= f.max]
    got = np.asarray(jax.jit(lambda b: _encode.encode(b, f))(sample.view(np.uint32)))
    want = lowp.encode(sample, f)
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, (
        f"{fmt}: 0x{sample.view(np.uint32)[diff[0]]:08X} -> {got[diff[0]]} != {want[diff[0]]}"
    )


@pytest.mark.parametrize("fmt", list(lowp.ELEMENT_FORMATS))
def test_stochastic_rounding_matches_lowp(fmt):
    f = lowp.FORMATS[fmt]
    rng = np.random.default_rng(4)
    n = 200_000
    v = rng.uniform(-f.max, f.max, n) * 2.0 ** rng.integers(-20, 1, n)
    v = ftz(np.clip(v, -f.max, f.max).astype(np.float32))
    v[:4] = [0.0, -0.0, f.max, -f.max]
    r = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    r[4:8] = [0, 2**32 - 1, 255, 256]
    got = np.asarray(
        jax.jit(lambda b, r: jax_rounding.round_elements(b, f, r))(v.view(np.uint32), r)
    )
    want = np_rounding.round_elements(v, f, r)
    diff = np.flatnonzero(got != want)
    assert diff.size == 0, (
        f"{fmt}: v=0x{v.view(np.uint32)[diff[0]]:08X} r={r[diff[0]]}: "
        f"{got[diff[0]]} != {want[diff[0]]}"
    )


@pytest.mark.parametrize(
    "seed, shape, offset",
    [
        (0, (3,), 0),
        (1234, (2, 3), 2**32 + 7),
        (-1, (5, 7), 0),
        (2**40 + 3, (4, 4, 4), 2**32 - 1),
        (7, (0, 3), 1),
    ],
)
def test_random_bits_match_lowp(seed, shape, offset):
    got = np.asarray(lowp_jax.random_bits(seed, shape, offset))
    want = lowp.random_bits(seed, shape, offset)
    assert got.dtype == np.uint32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    traced = jax.jit(lambda s, o: lowp_jax.random_bits(s, shape, o))(
        jnp.uint32(seed % 2**32), jnp.uint32(offset % 2**32)
    )
    np.testing.assert_array_equal(np.asarray(traced), want)


def test_random_bits_refuses_non_integers():
    with pytest.raises(TypeError, match="1.5"):
        lowp_jax.random_bits(1.5, (2,))
    with pytest.raises(TypeError, match="seed"):
        lowp_jax.random_bits(True, (2,))
    with pytest.raises(TypeError, match="offset"):
        lowp_jax.random_bits(1, (2,), jnp.float32(1))


@pytest.mark.parametrize("name, dtype", [("float16", np.float16), ("bfloat16", ml_dtypes.bfloat16)])
def test_half_precision_conversions_are_exact(name, dtype):
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)
    got = np.asarray(jax.jit(_dtypes.to_f32_bits)(jnp.asarray(every)))
    want = every.astype(np.float32)
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite], want.view(np.uint32)[finite])

    rng = np.random.default_rng(5)
    b = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    # around every representable value of the narrow dtype: its ties and neighbours
    around = (want[finite].view(np.uint32)[:, None].astype(np.int64) + np.arange(-2, 3)).reshape(-1)
    b = np.concatenate(
        [b, around.clip(0, 2**32 - 1).astype(np.uint32), (want[finite].view(np.uint32) + (1 << 12))]
    )
    b = ftz(b.view(np.float32)).view(np.uint32)  # dequantized values are flushed first
    got = np.asarray(jax.jit(lambda b: _dtypes.from_f32_bits(b, name))(b)).view(np.uint16)
    with np.errstate(all="ignore"):
        want = b.view(np.float32).astype(dtype).view(np.uint16)
    nan = np.isnan(b.view(np.float32))
    diff = np.flatnonzero((got != want) & ~nan)
    assert diff.size == 0, (
        f"0x{b[diff[0]]:08X} -> 0x{got[diff[0]]:04X}, NumPy 0x{want[diff[0]]:04X}"
    )


@pytest.mark.parametrize("fmt", lowp.ELEMENT_FORMATS)
def test_power_of_two_scales_from_exponent_bits_equal_the_divisions(fmt):
    """pow2_floor_div and reciprocal_pow2 against div_rn then clearing the mantissa, and
    div_rn(1, m): every exponent of b, with the significands around the numerator's (the
    only place the floor changes), the ends of each binade and random ones."""
    numerator = float(lowp.FORMATS[fmt].max)
    sig = int(np.float32(numerator).view(np.uint32)) & 0x7FFFFF
    rng = np.random.default_rng(3)
    mantissas = np.unique(
        np.concatenate(
            [
                [0, 1, 0x7FFFFF, max(sig - 1, 0), sig, min(sig + 1, 0x7FFFFF)],
                rng.integers(0, 0x800000, 64),
            ]
        )
    ).astype(np.uint32)
    exponents = np.arange(1, 255, dtype=np.uint32)
    b = ((exponents[:, None] << 23) | mantissas[None, :]).ravel().view(np.float32)

    @jax.jit
    def both(b):
        divided = _exact.div_rn(np.float32(numerator), b)
        m_want = lax.bitcast_convert_type(
            lax.bitcast_convert_type(divided, jnp.uint32) & np.uint32(0x7F800000), jnp.float32
        )
        m = _exact.pow2_floor_div(numerator, b)
        return m, m_want, _exact.reciprocal_pow2(m), _exact.div_rn(np.float32(1), m_want)

    m, m_want, d, d_want = both(b)
    assert np.isinf(m_want).any()  # the overflow corner is among the cases
    assert_same_bits(m, m_want, b)
    assert_same_bits(d, d_want, b)


def test_power_of_two_division_rejects_a_numerator_with_subnormal_quotients():
    with pytest.raises(ValueError, match="at least 4, got 1.0"):
        _exact.pow2_floor_div(1.0, jnp.float32(3))
