"""lowp_jax against lowp, byte for byte, under jit (tier (a) of STYLE §7).

Every scheme x element format x rank 1-4, on the edge cases of spec §6 and the rounding
edges (tests/jax_frontend/jax_cases.py), for float32, bfloat16 and float16 inputs, nearest and
stochastic rounding: the codes, scales and global scale of `to_lowp(jit(quantize)(x))`
equal `lowp.quantize(x)`'s, and the dequantized float32/bfloat16/float16 outputs equal
`lowp.dequantize`'s bit for bit. A failure names the case, the first differing element,
its input bits and both outputs.

Compilation dominates the run time, so it is bounded: each (scheme, rounding) is jitted
once and fed every case of one shape; bfloat16 and float16 share the schemes at one rank
each; stochastic rounding takes every other scheme at rank 4; dequantization goes to every
output dtype for a third of the rank-2 schemes and to the input's dtype elsewhere.
"""

import jax
import jax.numpy as jnp
import jax_cases as C
import numpy as np
import pytest

import lowp
import lowp_jax

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered")


def _cases(ranks):
    return [(rank, s) for rank in ranks for s in C.schemes_for_rank(rank)]


def _ids(cases):
    return [f"r{rank}-{C.scheme_id(s)}" for rank, s in cases]


def _check_all(shape, scheme, hp_dtype, **kwargs):
    failures = []
    for name, x in C.edge_cases(shape, scheme, hp_dtype):
        errors = C.run_case(x, scheme, **kwargs)
        if errors:
            failures.append(C.describe(name, scheme, hp_dtype, errors))
    assert not failures, "\n".join(failures[:5])


F32_CASES = _cases((1, 2, 3, 4))


# These also dequantize to every output dtype (elsewhere: to the input's dtype only, and
# the bfloat16/float16 tests cover those outputs from their own inputs).
EVERY_OUT_DTYPE = set(_ids(_cases((2,))[::3]))


@pytest.mark.parametrize("rank, scheme", F32_CASES, ids=_ids(F32_CASES))
def test_float32_nearest(rank, scheme):
    every = _ids([(rank, scheme)])[0] in EVERY_OUT_DTYPE
    _check_all(C.SHAPES[rank], scheme, "float32", every_out_dtype=every)


# bfloat16 and float16 only change the input conversion (tested exhaustively in
# test_jax_exact.py), so they split the schemes between them: bfloat16 takes the even
# entries of the rank-2 list, float16 the odd entries of the rank-3 list.
BF16_CASES, F16_CASES = _cases((2,))[0::2], _cases((3,))[1::2]


@pytest.mark.parametrize("rank, scheme", BF16_CASES, ids=_ids(BF16_CASES))
def test_bfloat16_nearest(rank, scheme):
    _check_all(C.SHAPES[rank], scheme, "bfloat16")


@pytest.mark.parametrize("rank, scheme", F16_CASES, ids=_ids(F16_CASES))
def test_float16_nearest(rank, scheme):
    _check_all(C.SHAPES[rank], scheme, "float16")


# Stochastic rounding changes only the element step, so every other entry of the
# rank-4 list (every format with every scheme kind) covers it.
STOCHASTIC_CASES = _cases((4,))[0::2] + [(4, lowp.NVFP4Scaling(block=8))]


@pytest.mark.parametrize("rank, scheme", STOCHASTIC_CASES, ids=_ids(STOCHASTIC_CASES))
def test_stochastic_with_seed(rank, scheme):
    _check_all(
        C.SHAPES[rank], scheme, "float32", rounding="stochastic", seed=C.SEED, offset=C.OFFSET
    )


@pytest.mark.parametrize(
    "scheme",
    [
        lowp.AxisScaling("float8_e5m2"),
        lowp.MXScaling("float6_e3m2fn", block=8, mode="ceil"),
        lowp.NVFP4Scaling(block=8),
    ],
    ids=C.scheme_id,
)
@pytest.mark.parametrize("hp_dtype", ["float32", "bfloat16"])
def test_stochastic_with_explicit_random_bits(scheme, hp_dtype):
    shape = C.SHAPES[2]
    rng = np.random.default_rng(5)
    failures = []
    for name, x in C.edge_cases(shape, scheme, hp_dtype):
        r = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
        r[0, :4] = [0, 2**32 - 1, 255, 256]  # the extremes of r >> 8
        errors = C.run_case(x, scheme, rounding="stochastic", random=r)
        if errors:
            failures.append(C.describe(name, scheme, hp_dtype, errors))
    assert not failures, "\n".join(failures[:5])


def test_traced_seed_matches_a_static_one():
    scheme = lowp.MXScaling("float8_e4m3fn", block=8)
    x = C.edge_cases(C.SHAPES[2], scheme, "float32")[0][1]
    f = jax.jit(
        lambda x, seed, offset: lowp_jax.quantize(
            x, scheme, rounding="stochastic", seed=seed, offset=offset
        )
    )
    for seed, offset in [(0, 0), (-1, 3), (2**31 + 5, 2**32 - 1)]:
        got = lowp_jax.to_lowp(f(x, jnp.uint32(seed % 2**32), jnp.uint32(offset)))
        ref = lowp.quantize(x, scheme, rounding="stochastic", seed=seed, offset=offset)
        assert not C.compare_qtensors(x, ref, got), (seed, offset)
    got = lowp_jax.to_lowp(f(x, jnp.int32(-1), jnp.int32(3)))  # int32 -1 is 2**32 - 1 mod 2**32
    ref = lowp.quantize(x, scheme, rounding="stochastic", seed=2**32 - 1, offset=3)
    assert not C.compare_qtensors(x, ref, got)


# --- shapes the rank-1..4 grid leaves out ---------------------------------------------


@pytest.mark.parametrize(
    "scheme",
    [lowp.MXScaling(fmt, mode=mode) for fmt in C.ELEMENTS for mode in ("floor", "rceil")]
    + [
        lowp.NVFP4Scaling(),
        lowp.NVFP4Scaling(global_scale=False),
        lowp.BlockScaling(block=(1, 128)),
    ],
    ids=C.scheme_id,
)
def test_default_block_sizes(scheme):
    _check_all((4, 256), scheme, "float32")


@pytest.mark.parametrize("shape", [(0,), (0, 32), (4, 0), (2, 0, 32)])
@pytest.mark.parametrize(
    "scheme",
    [
        lowp.TensorScaling(),
        lowp.AxisScaling(),
        lowp.AxisScaling(axis=0),
        lowp.MXScaling(),
        lowp.NVFP4Scaling(),
        lowp.NVFP4Scaling(global_scale=False),
    ],
    ids=C.scheme_id,
)
def test_empty_tensors(shape, scheme):
    x = np.zeros(shape, np.float32)
    assert not C.run_case(x, scheme)
    if isinstance(scheme, lowp.NVFP4Scaling) and scheme.global_scale:
        assert float(lowp_jax.quantize(x, scheme).global_scale) == 1.0


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (2, 0, 5)])
def test_empty_tensors_block_scaling(shape):
    assert not C.run_case(np.zeros(shape, np.float32), lowp.BlockScaling(block=(2, 4)))


@pytest.mark.parametrize("fmt", C.ELEMENTS[:-1])
def test_rank0_tensor_scaling(fmt):
    for value in [0.0, -0.0, 3.5, -1e-40, np.nan, np.inf, 448.0, 3e38]:
        x = np.array(value, np.float32)
        assert not C.run_case(x, lowp.TensorScaling(fmt)), value


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_axis_scaling_on_other_axes(axis):
    scheme = lowp.AxisScaling("float8_e4m3fn", axis=axis)
    _check_all((5, 7, 3), scheme, "float32")


def test_mx_along_a_middle_axis():
    _check_all((3, 16, 5), lowp.MXScaling("float8_e5m2", block=4, mode="rceil", axis=1), "float32")


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
    assert not C.run_case(x, lowp.NVFP4Scaling(), every_out_dtype=True)


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
