"""The core's grouped operands (spec §10): group sizes, the plan, the reference bytes, and
the pair trick the frontends compute them with."""

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp import extend

RECIPES = ("float8_tensorwise", "float8_rowwise", "mxfp8", "float8_rowwise_gw_hp", "mxfp8_gw_hp")
SCHEMES = {
    "tensor": lowp.TensorScaling("float8_e5m2"),
    "rowwise": lowp.AxisScaling(pow2=True),
    "mx": lowp.MXScaling(block=32, mode="rceil"),
}
# empty experts, one token, all tokens in one expert, sizes off multiples of 16/32/128
SIZES = {
    "mixed": [0, 5, 40, 1, 18, 0, 33],
    "one_token": [0, 1, 0],
    "one_expert": [0, 0, 70, 0],
    "odd": [17, 129, 31, 3],
}


def _tokens(sizes, c=64, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((sum(sizes), c)) * 3.0).astype(dtype)


def test_offs_and_group_sizes_are_one_form():
    assert extend.group_sizes_from_offs(np.array([2, 2, 7], np.int32), 7).tolist() == [2, 0, 5]
    assert extend.check_group_sizes([2, 0, 5], 7).dtype == np.int64
    with pytest.raises(ValueError, match="sum to 6, the input has 7"):
        extend.check_group_sizes([1, 0, 5], 7)
    with pytest.raises(ValueError, match="negative"):
        extend.group_sizes_from_offs(np.array([3, 2, 7]), 7)
    with pytest.raises(ValueError, match="integer"):
        extend.check_group_sizes(np.array([1.0, 2.0]), 3)


@pytest.mark.parametrize("name", RECIPES)
def test_plan_kinds(name):
    plan = extend.GroupedPlan.of(lowp.Recipe.from_name(name))
    assert (plan.forward.a.kind, plan.forward.b.kind) == ("rows", "experts")
    if plan.dgrad is not None:
        assert (plan.dgrad.a.tensor, plan.dgrad.b.tensor) == ("g", "w.T")
    if name.endswith("gw_hp"):
        assert plan.wgrad is None
    else:
        assert (plan.wgrad.a.kind, plan.wgrad.b.kind) == ("tokens", "tokens")


def test_plan_checks_feature_dims_and_refuses_other_schemes():
    plan = extend.GroupedPlan.of(lowp.Recipe.from_name("mxfp8"))
    plan.check(64, 96)
    with pytest.raises(ValueError, match="dgrad GEMM cannot quantize g along N = 48"):
        plan.check(64, 48)
    block = lowp.BlockScaling(block=(1, 128))
    recipe = lowp.Recipe("blocks", *(lowp.GemmSpec(block, block),) * 3)
    with pytest.raises(ValueError, match="forward GEMM: grouped GEMM operands take"):
        extend.GroupedPlan.of(recipe)


@pytest.mark.parametrize("scheme", ["rowwise", "mx"])
def test_rows_and_experts_are_the_plain_quantization(scheme):
    """Scales along the features never leave a row: the whole tensor's bytes."""
    sizes = SIZES["mixed"]
    x = _tokens(sizes, dtype=ml_dtypes.bfloat16)
    q = extend.quantize_grouped(x, SCHEMES[scheme], sizes, "rows")
    whole = lowp.quantize(x, SCHEMES[scheme])
    np.testing.assert_array_equal(q.codes, whole.codes)
    np.testing.assert_array_equal(q.scale, whole.scale)
    w = _tokens([4 * 16], seed=1).reshape(4, 16, 64)
    q = extend.quantize_grouped(w, SCHEMES[scheme], [1, 1, 1, 1], "experts")
    np.testing.assert_array_equal(q.codes, lowp.quantize(w, SCHEMES[scheme]).codes)


def test_tensorwise_is_one_scale_per_expert():
    sizes = SIZES["mixed"]
    x = _tokens(sizes)
    q = extend.quantize_grouped(x, SCHEMES["tensor"], sizes, "rows")
    assert q.scale.shape == (len(sizes),)
    start = sizes[0] + sizes[1]
    part = lowp.quantize(x[start : start + sizes[2]], SCHEMES["tensor"])
    assert q.scale[2] == part.scale
    np.testing.assert_array_equal(q.codes[start : start + sizes[2]], part.codes)
    empty = lowp.quantize(np.zeros((0, 64), np.float32), SCHEMES["tensor"])
    assert q.scale[0] == empty.scale  # an empty expert: amax 0, the finite EPS scale


def test_mx_tokens_short_block_is_its_own_rows():
    """Expert 1 has 5 tokens: one short block whose scale is those 5 tokens' amax; the
    scale slots past the last expert's blocks hold an all-zero block's byte."""
    sizes = [32, 5, 0, 40]
    x = _tokens(sizes)
    x[32:37] *= 100.0  # a block straddling experts would take this amax
    q = extend.quantize_grouped(x, SCHEMES["mx"], sizes, "tokens")
    capacity = extend.token_capacity(77, 4, 32)
    assert q.codes.shape == (64, 77) and q.scale.shape == (64, capacity)
    first = lowp.quantize(np.ascontiguousarray(x[:32].T), SCHEMES["mx"])
    np.testing.assert_array_equal(q.scale[:, :1], first.scale)
    np.testing.assert_array_equal(q.codes[:, :32], first.codes)
    padded = np.zeros((64, 32), np.float32)
    padded[:, :5] = x[32:37].T
    short = lowp.quantize(padded, SCHEMES["mx"])
    np.testing.assert_array_equal(q.scale[:, 1:2], short.scale)
    np.testing.assert_array_equal(q.codes[:, 32:37], short.codes[:, :5])
    used = 1 + 1 + 0 + 2
    assert (q.scale[:, used:] == 0).all()
    np.testing.assert_allclose(q.dequantize(), x.T, rtol=0.07, atol=1e-3)


@pytest.mark.parametrize("kind", ["rows", "tokens"])
@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_nan_poisons_only_its_experts_groups(kind, scheme):
    sizes = [40, 33, 0, 7]
    x = _tokens(sizes)
    x[45, 3] = np.nan
    x[50, 9] = np.inf
    out = extend.quantize_grouped(x, SCHEMES[scheme], sizes, kind).dequantize()
    out = out if kind == "rows" else out.T
    bad = np.isnan(out).any(axis=1)
    assert not bad[:40].any() and not bad[73:].any()
    assert bad[45] and bad[50]


def _pair_trick(x, scheme, sizes, kind):
    """What the frontends compute, in NumPy: each element paired with its group's amax
    (a segment max over its expert's rows, or MX block slot), quantized by `pair_scheme`."""
    t = x.shape[0]
    xf = x.astype(np.float32)
    absb = xf.view(np.uint32) & np.uint32(0x7FFFFFFF)
    tensorwise = isinstance(scheme, lowp.TensorScaling)
    block = scheme.block if isinstance(scheme, lowp.MXScaling) and kind == "tokens" else None
    seg = extend.token_segments(np.array(sizes), block)
    n = extend.token_capacity(t, len(sizes), block) if block else len(sizes)
    if tensorwise:
        absb = absb.max(axis=1, keepdims=True, initial=0)
    amax = np.zeros((n, absb.shape[1]), np.uint32)
    np.maximum.at(amax, seg, absb)
    a = amax.view(np.float32)
    ps = extend.pair_scheme(scheme)
    codes = lowp.quantize(np.stack([xf, np.broadcast_to(a[seg], xf.shape)], -1), ps).codes[..., 0]
    scale = lowp.quantize(np.stack([a, a], -1), ps).scale[..., 0]
    if tensorwise:
        return codes if kind == "rows" else codes.T, scale[:, 0]
    return codes.T, scale.T


@pytest.mark.parametrize("sizes", sorted(SIZES))
@pytest.mark.parametrize(
    "scheme,kind",
    [("tensor", "rows"), ("tensor", "tokens"), ("rowwise", "tokens"), ("mx", "tokens")],
)
def test_pair_trick_gives_the_reference_bytes(sizes, scheme, kind):
    sizes = SIZES[sizes]
    x = _tokens(sizes, seed=3, dtype=ml_dtypes.bfloat16)
    if sum(sizes) > 4:
        x[3, 5] = np.nan  # poisons one group
        x[4, :] = np.float32(1e-40)  # subnormals flush in the amax too
    ref = extend.quantize_grouped(x, SCHEMES[scheme], sizes, kind)
    codes, scale = _pair_trick(x, SCHEMES[scheme], sizes, kind)
    np.testing.assert_array_equal(codes, ref.codes)
    np.testing.assert_array_equal(
        np.ascontiguousarray(scale).view(np.uint8), ref.scale.view(np.uint8)
    )
