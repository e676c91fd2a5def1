"""lowp_jax against lowp, byte for byte, under jit: what the cross-backend suite leaves to it.

The grid (every scheme x element format x rank 1-4 x spec §6 edge case, float32 /
bfloat16 / float16 inputs, nearest and seeded stochastic rounding, empty tensors, the
cuBLAS layout, every output dtype) runs on jax_cpu and jax_gpu in tests/conformance/
through lowp_apps.conformance. Here: explicit and traced random bits, default block sizes,
rank 0, other axes, hand-derived bytes, and products on the flush boundary where XLA on
a CPU and IEEE part. A failure names the case, the first differing element, its input
bits and both outputs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowp
import lowp_jax
from lowp_apps.conformance import backends, cases, compare, run

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered")

JAX_CPU = backends.get("jax_cpu")


def _check_all(config):
    """Every edge case of `config` through jax_cpu's jitted quantize + dequantize."""
    failures = []
    for edge, x in cases.inputs(config):
        problems = run.check(JAX_CPU, config, x)
        if problems:
            failures.append(f"{config.id} [{edge}]:\n  " + "\n  ".join(problems))
    assert not failures, "\n".join(failures[:5])


def _differences(x, ref, q) -> list[str]:
    """How lowp_jax's QArray q (and its dequantization) differs from lowp's `ref`."""
    got = compare.Outputs(lowp_jax.to_lowp(q), {ref.hp_dtype: np.asarray(lowp_jax.dequantize(q))})
    return compare.differences(x, ref, got)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme",
    [
        lowp.AxisScaling("float8_e5m2"),
        lowp.MXScaling("float6_e3m2fn", block=8, mode="ceil"),
        lowp.NVFP4Scaling(block=8),
    ],
    ids=cases.scheme_id,
)
@pytest.mark.parametrize("hp_dtype", ["float32", "bfloat16"])
def test_stochastic_with_explicit_random_bits(scheme, hp_dtype):
    config = cases.Configuration(scheme, cases.SHAPES[2], hp_dtype)
    rng = np.random.default_rng(5)
    quantize = jax.jit(
        lambda x, r: lowp_jax.quantize(x, scheme, rounding="stochastic", random_bits=r)
    )
    failures = []
    for edge, x in cases.inputs(config):
        r = rng.integers(0, 2**32, size=x.shape, dtype=np.uint64).astype(np.uint32)
        r[0, :4] = [0, 2**32 - 1, 255, 256]  # the extremes of r >> 8
        ref = lowp.quantize(x, scheme, rounding="stochastic", random_bits=r)
        problems = _differences(x, ref, quantize(x, r))
        if problems:
            failures.append(f"[{edge}] " + "\n  ".join(problems))
    assert not failures, "\n".join(failures[:5])


def test_traced_seed_matches_a_static_one():
    scheme = lowp.MXScaling("float8_e4m3fn", block=8)
    x = cases.make_input("random", cases.SHAPES[2], scheme)
    f = jax.jit(
        lambda x, seed, offset: lowp_jax.quantize(
            x, scheme, rounding="stochastic", seed=seed, offset=offset
        )
    )
    for seed, offset in [(0, 0), (-1, 3), (2**31 + 5, 2**32 - 1)]:
        got = f(x, jnp.uint32(seed % 2**32), jnp.uint32(offset))
        ref = lowp.quantize(x, scheme, rounding="stochastic", seed=seed, offset=offset)
        assert not _differences(x, ref, got), (seed, offset)
    got = f(x, jnp.int32(-1), jnp.int32(3))  # int32 -1 is 2**32 - 1 mod 2**32
    ref = lowp.quantize(x, scheme, rounding="stochastic", seed=2**32 - 1, offset=3)
    assert not _differences(x, ref, got)


# --- shapes the rank-1..4 grid leaves out ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme",
    [lowp.MXScaling(fmt, mode=mode) for fmt in cases.ELEMENTS for mode in ("floor", "rceil")]
    + [
        lowp.NVFP4Scaling(),
        lowp.NVFP4Scaling(global_scale=False),
        lowp.BlockScaling(block=(1, 128)),
    ],
    ids=cases.scheme_id,
)
def test_default_block_sizes(scheme):
    _check_all(cases.Configuration(scheme, (4, 256)))


@pytest.mark.parametrize("fmt", cases.ELEMENTS[:-1])
def test_rank0_tensor_scaling(fmt):
    config = cases.Configuration(lowp.TensorScaling(fmt), ())
    for value in [0.0, -0.0, 3.5, -1e-40, np.nan, np.inf, 448.0, 3e38]:
        assert not run.check(JAX_CPU, config, np.array(value, np.float32)), value


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_axis_scaling_on_other_axes(axis):
    _check_all(cases.Configuration(lowp.AxisScaling("float8_e4m3fn", axis=axis), (5, 7, 3)))


def test_mx_along_a_middle_axis():
    _check_all(
        cases.Configuration(
            lowp.MXScaling("float8_e5m2", block=4, mode="rceil", axis=1), (3, 16, 5)
        )
    )


# --- by hand (the lowp tests' hand-derived bytes, through lowp_jax) -----------------------


def test_tensorwise_e4m3_by_hand():
    q = jax.jit(lambda x: lowp_jax.quantize(x, lowp.TensorScaling()))(
        jnp.array([1.0, -2.0, 448.0, 432.0, 0.0, -0.0])
    )
    assert lowp_jax.to_lowp(q).codes.tolist() == [0x38, 0xC0, 0x7E, 0x7E, 0x00, 0x80]
    assert q.codes.dtype == jnp.float8_e4m3fn and q.scale.dtype == jnp.float32


def test_mx_floor_saturates_464_and_rceil_halves():
    x = jnp.zeros(32).at[0].set(464.0)
    floor = lowp_jax.to_lowp(lowp_jax.quantize(x, lowp.MXScaling(mode="floor")))
    rceil = lowp_jax.quantize(x, lowp.MXScaling(mode="rceil"))
    assert floor.codes[0] == 0x7E and lowp_jax.to_lowp(rceil).codes[0] == 0x76
    assert float(lowp_jax.dequantize(rceil)[0]) == 448.0
    assert rceil.scale.dtype == jnp.uint8  # e8m0 bytes


def test_poisoned_groups_dequantize_to_canonical_nans():
    q = lowp_jax.quantize(jnp.array([1.0, jnp.nan]), lowp.TensorScaling())
    assert np.asarray(lowp_jax.dequantize(q)).view(np.uint32).tolist() == [0x7FC00000] * 2
    assert np.asarray(lowp_jax.dequantize(q, "bfloat16")).view(np.uint16).tolist() == [0x7FC0] * 2
    assert np.asarray(lowp_jax.dequantize(q, jnp.float16)).view(np.uint16).tolist() == [0x7E00] * 2


def test_nvfp4_with_global_scale_is_poisoned_whole():
    x = jnp.ones((2, 32)).at[1, 20].set(jnp.inf)
    q = lowp_jax.to_lowp(jax.jit(lambda x: lowp_jax.quantize(x, lowp.NVFP4Scaling()))(x))
    assert q.global_scale.view(np.uint32) == 0x7FC00000
    assert (q.scale == 0x7F).all() and (q.codes == 0).all()


# --- products on the flush boundary: XLA on CPU flushes them, IEEE rounds up to 2**-126 ---


def _ftz32(v):
    b = np.float32(v).view(np.uint32)
    return np.uint32(b & 0x80000000 if (b & 0x7F800000) == 0 else b).view(np.float32)


def _tensor_amax_for_global_scale(s_dec):
    """A float32 tensor amax A whose NVFP4 global scale ftz(1/RN32(2688/A)) is s_dec."""
    start = int(np.float32(2688 * float(s_dec)).view(np.uint32))
    for delta in range(-200, 201):
        amax = np.uint32(start + delta).view(np.float32)
        if _ftz32(np.float32(1) / (np.float32(2688) / amax)) == s_dec:
            return amax
    raise AssertionError("no tensor amax gives that global scale")


def test_nvfp4_block_scale_product_on_the_flush_tie():
    # S_dec = 11184810 * 2**-142 and a block scale of 3 * 2**-9 make p = value(sb) * S_dec
    # exactly 2**-126 - 2**-150: IEEE rounds that tie up to 2**-126 (kept), XLA on CPU
    # flushes it (24-bit result below 2**-126). p sets the block's codes and outputs.
    s_dec = np.float32(11184810 * 2.0**-142)
    three_512ths = np.float32(3 * 2.0**-9)
    assert np.float32(three_512ths * s_dec) == np.float32(2.0**-126)  # IEEE: the smallest normal
    amax = _tensor_amax_for_global_scale(s_dec)
    k = np.float32(np.float32(2688) / amax) * (np.float32(1) / np.float32(6))
    block_amax = np.float32(three_512ths / k)
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 16:20] = amax, [block_amax, -block_amax / 2, block_amax / 3, 1e-40]
    ref = lowp.quantize(x, lowp.NVFP4Scaling())
    assert ref.scale[0, 1] == 0x03  # e4m3 code of 3 * 2**-9
    config = cases.Configuration(lowp.NVFP4Scaling(), x.shape, extras=True)
    assert not run.check(JAX_CPU, config, x)


def test_dequantize_product_rounding_up_to_the_smallest_normal():
    # value(code) = 0.5 and p = 2**-125 - 2**-149 (a stored global scale, block scale 1.0):
    # the product 2**-126 - 2**-150 is IEEE's smallest normal and XLA-on-CPU's zero.
    p = np.uint32(0x00FFFFFF).view(np.float32)
    codes = np.full((1, 8), 0x11, np.uint8)  # every element 0.5 (e2m1 code 1), two a byte
    qt = lowp.QTensor(
        codes,
        np.full((1, 1), 0x38, np.uint8),
        np.array(p, np.float32),
        lowp.NVFP4Scaling(),
        (1, 16),
        "float32",
    )
    want = lowp.dequantize(qt)
    assert (want.view(np.uint32) == 0x00800000).all()
    got = jax.jit(lowp_jax.dequantize)(lowp_jax.from_lowp(qt))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))
