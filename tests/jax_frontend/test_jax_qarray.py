"""QArray as a pytree (jit, grad, vmap), its exact conversions to and from lowp.QTensor,
check_finite eagerly and through checkify, and the errors for bad input."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import checkify

import lowp
import lowp_jax
from lowp_apps.conformance import cases, compare

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered")

SCHEMES = [
    lowp.TensorScaling(),
    lowp.AxisScaling("float8_e5m2", axis=0),
    lowp.BlockScaling("float6_e3m2fn", block=(2, 8)),
    lowp.MXScaling("float6_e2m3fn", mode="rceil"),
    lowp.MXScaling("float4_e2m1fn"),
    lowp.NVFP4Scaling(),
    lowp.NVFP4Scaling(global_scale=False),
]
STORAGE = {
    "float8_e4m3fn": jnp.float8_e4m3fn,
    "float8_e5m2": jnp.float8_e5m2,
    "float6_e2m3fn": jnp.uint8,
    "float6_e3m2fn": jnp.uint8,
    "float4_e2m1fn": jnp.uint8,
}


def _x(shape=(4, 64), seed=0):
    return cases.make_input("random", shape, lowp.TensorScaling(), variant=seed)


def _differences(x, ref, got) -> list[str]:
    """How the QTensor `got` differs from lowp's `ref` (codes, scales, metadata)."""
    return compare.differences(x, ref, compare.Outputs(got, {}))


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES, ids=cases.scheme_id)
def test_storage_dtypes_and_shapes(scheme):
    q = lowp_jax.quantize(_x(), scheme)
    assert q.codes.dtype == STORAGE[scheme.fmt]
    assert q.codes.shape == ((4, 32) if scheme.fmt == "float4_e2m1fn" else (4, 64))
    want_scale = {lowp.MXScaling: jnp.uint8, lowp.NVFP4Scaling: jnp.float8_e4m3fn}.get(
        type(scheme), jnp.float32
    )
    assert q.scale.dtype == want_scale and q.scale.shape == scheme.scale_shape((4, 64))
    assert (q.global_scale is not None) == (
        isinstance(scheme, lowp.NVFP4Scaling) and scheme.global_scale
    )


@pytest.mark.slow
@pytest.mark.parametrize("scheme", SCHEMES, ids=cases.scheme_id)
def test_pytree_round_trip_and_jit_passthrough(scheme):
    q = lowp_jax.quantize(_x(), scheme)
    leaves, treedef = jax.tree_util.tree_flatten(q)
    assert len(leaves) == (3 if q.global_scale is not None else 2)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again.scheme == scheme and again.shape == q.shape and again.hp_dtype == q.hp_dtype
    out = jax.jit(lambda q: q.dequantize())(q)  # a QArray as a jit argument
    np.testing.assert_array_equal(
        np.asarray(out).view(np.uint32), lowp.dequantize(lowp_jax.to_lowp(q)).view(np.uint32)
    )
    q2 = jax.jit(lambda x: lowp_jax.quantize(x, scheme))(_x())  # and as a result
    assert isinstance(q2, lowp_jax.QArray) and q2.scheme == scheme


LAYOUT_CASES = [(s, "plain") for s in SCHEMES] + [
    (s, "cublas_blocked") for s in SCHEMES if isinstance(s, (lowp.MXScaling, lowp.NVFP4Scaling))
]  # the cublas_blocked layout exists for MX and NVFP4 scales only


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme, layout", LAYOUT_CASES, ids=lambda v: v if isinstance(v, str) else cases.scheme_id(v)
)
def test_to_and_from_lowp_are_exact(scheme, layout):
    # A NaN: a poisoned group.
    x = cases.make_input("nan", (3, 64), scheme).astype(cases.HP_DTYPES["bfloat16"])
    qt = lowp.quantize(x, scheme)
    if layout == "cublas_blocked":
        qt = qt.with_scale_layout(layout)
    q = lowp_jax.from_lowp(qt)
    assert q.scale_layout == layout
    back = lowp_jax.to_lowp(q)
    assert not _differences(x, qt.with_scale_layout("plain"), back.with_scale_layout("plain"))
    assert back.scale.tobytes() == qt.scale.tobytes()
    for out_dtype in cases.HP_DTYPES:
        assert not compare.first_difference(
            "dequantize",
            np.asarray(lowp_jax.dequantize(q, out_dtype)),
            lowp.dequantize(qt, out_dtype),
            x,
            scheme,
            "elements",
        )
    if layout == "cublas_blocked":  # the JAX swizzle equals lowp's both ways
        plain = lowp_jax.quantize(x, scheme)
        blocked = lowp_jax.to_lowp(plain.with_scale_layout(layout))
        assert blocked.scale.tobytes() == qt.scale.tobytes()
        assert not _differences(
            x, lowp.quantize(x, scheme), lowp_jax.to_lowp(q.with_scale_layout("plain"))
        )


def test_qarray_refuses_inconsistent_fields():
    q = lowp_jax.quantize(_x(), lowp.MXScaling())
    with pytest.raises(ValueError, match="scale must have shape"):
        dataclasses.replace(q, scale=jnp.zeros((4, 1), jnp.uint8))
    with pytest.raises(TypeError, match="codes must be float8_e4m3fn"):
        dataclasses.replace(q, codes=jnp.zeros((4, 64), jnp.uint8))
    with pytest.raises(ValueError, match="hp_dtype"):
        dataclasses.replace(q, hp_dtype="float64")
    with pytest.raises(ValueError, match="global_scale must be None"):
        dataclasses.replace(q, global_scale=jnp.float32(1))
    with pytest.raises(TypeError, match="QArray"):
        lowp_jax.to_lowp(lowp.quantize(_x(), lowp.MXScaling()))
    with pytest.raises(TypeError, match="QTensor"):
        lowp_jax.from_lowp(q)


# --- grad ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_grad_flows_through_other_inputs_of_a_dequantized_value():
    scheme = lowp.MXScaling(mode="rceil")
    x, w = _x((2, 32)), _x((2, 32), seed=1)
    q = lowp_jax.quantize(x, scheme)

    def loss(w, q):
        return jnp.sum(jnp.tanh(q.dequantize() * w))

    g = jax.jit(jax.grad(loss))(w, q)
    deq = np.asarray(q.dequantize())
    want = deq * (1 - np.tanh(deq * w) ** 2)
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-30)
    for scheme in (lowp.MXScaling(mode="rceil"), lowp.NVFP4Scaling(), lowp.AxisScaling()):
        q = lowp_jax.quantize(x, scheme)
        gq = jax.grad(loss, argnums=1, allow_int=True)(w, q)  # q's own cotangent: no gradient
        assert isinstance(gq, lowp_jax.QArray)
        for leaf in jax.tree_util.tree_leaves(gq):  # float0 for integer leaves, else zeros
            assert leaf.dtype == jax.dtypes.float0 or not np.asarray(leaf, np.float32).any(), leaf


@pytest.mark.slow
def test_quantize_passes_no_gradient_and_fake_quantize_passes_it_straight_through():
    scheme = lowp.NVFP4Scaling()
    x = jnp.asarray(_x((2, 32)))
    g = jax.grad(lambda x: jnp.sum(lowp_jax.dequantize(lowp_jax.quantize(x, scheme)) ** 2))(x)
    assert not np.asarray(g).any()
    g = jax.jit(jax.grad(lambda x: jnp.sum(lowp_jax.fake_quantize(x, scheme) * 3.0)))(x)
    np.testing.assert_array_equal(np.asarray(g), np.full(x.shape, 3.0, np.float32))
    fq = jax.jit(lambda x: lowp_jax.fake_quantize(x, scheme, rounding="stochastic", seed=9))(x)
    want = lowp.dequantize(lowp.quantize(np.asarray(x), scheme, rounding="stochastic", seed=9))
    np.testing.assert_array_equal(np.asarray(fq).view(np.uint32), want.view(np.uint32))
    bf = jnp.asarray(x, jnp.bfloat16)
    assert lowp_jax.fake_quantize(bf, scheme).dtype == jnp.bfloat16
    assert (
        jax.grad(lambda x: lowp_jax.fake_quantize(x, scheme).astype(jnp.float32).sum())(bf).dtype
        == jnp.bfloat16
    )


# --- vmap ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme, batched",
    [
        (lowp.AxisScaling(axis=-1), lowp.AxisScaling(axis=-1)),
        (lowp.AxisScaling(axis=0), lowp.AxisScaling(axis=1)),
        (lowp.BlockScaling(block=(2, 8)), lowp.BlockScaling(block=(2, 8))),
        (lowp.MXScaling(mode="ceil"), lowp.MXScaling(mode="ceil")),
        (
            lowp.MXScaling("float8_e5m2", block=2, axis=0),
            lowp.MXScaling("float8_e5m2", block=2, axis=1),
        ),
        (lowp.NVFP4Scaling(global_scale=False), lowp.NVFP4Scaling(global_scale=False)),
    ],
    ids=lambda s: cases.scheme_id(s),
)
def test_vmap_equals_quantizing_the_batch_where_groups_stay_inside_an_example(scheme, batched):
    xs = np.stack([_x((4, 64), seed=i) for i in range(3)])
    xs[1, 2, 5] = np.nan
    q = jax.jit(jax.vmap(lambda x: lowp_jax.quantize(x, scheme)))(xs)
    assert q.shape == (4, 64) and q.codes.shape[0] == 3  # per-example metadata, batched leaves
    ref = lowp.quantize(xs, batched)
    got = lowp_jax.to_lowp(
        lowp_jax.QArray(q.codes, q.scale, q.global_scale, batched, xs.shape, "float32")
    )
    assert not _differences(xs, ref, got)
    out = jax.vmap(lowp_jax.dequantize)(q)
    np.testing.assert_array_equal(
        np.asarray(out).view(np.uint32), lowp.dequantize(ref).view(np.uint32)
    )


@pytest.mark.parametrize("scheme", [lowp.TensorScaling(), lowp.NVFP4Scaling()], ids=cases.scheme_id)
def test_vmap_of_whole_tensor_scales_quantizes_each_example_on_its_own(scheme):
    xs = np.stack([_x((4, 64), seed=i) * 10.0**i for i in range(3)]).astype(np.float32)
    q = jax.vmap(lambda x: lowp_jax.quantize(x, scheme))(xs)
    for i in range(3):
        qi = jax.tree_util.tree_map(lambda leaf, i=i: leaf[i], q)
        assert not _differences(xs[i], lowp.quantize(xs[i], scheme), lowp_jax.to_lowp(qi))
    # Quantizing the batch as one tensor shares one scale across examples: other bytes.
    whole = lowp.quantize(xs, scheme)
    vmapped_codes = np.asarray(jax.device_get(q.codes)).view(np.uint8)
    assert vmapped_codes.shape == whole.codes.shape and not np.array_equal(
        vmapped_codes, whole.codes
    )


# --- check_finite ---------------------------------------------------------------------------


def test_check_finite_eagerly_raises_floating_point_error_naming_the_tensor():
    x = jnp.ones((2, 4)).at[1, 2].set(jnp.inf)
    with pytest.raises(FloatingPointError, match=r"layer1\.weight: 1 non-finite .*index \(1, 2\)"):
        lowp_jax.quantize(x, lowp.TensorScaling(), check_finite=True, name="layer1.weight")
    lowp_jax.quantize(jnp.ones(4), lowp.TensorScaling(), check_finite=True)  # finite: fine


def test_check_finite_under_jit_goes_through_checkify():
    f = jax.jit(
        functools.partial(
            lowp_jax.quantize, scheme=lowp.MXScaling(block=4), check_finite=True, name="act"
        )
    )
    x = jnp.ones(8).at[5].set(jnp.nan)
    err, _ = checkify.checkify(f)(x)
    with pytest.raises(
        checkify.JaxRuntimeError, match=r"act: 1 non-finite element\(s\), the first at index \(5,\)"
    ):
        err.throw()
    err, q = checkify.checkify(f)(jnp.ones(8))
    err.throw()  # no error
    assert (
        lowp_jax.to_lowp(q).codes.tolist()
        == lowp.quantize(np.ones(8, np.float32), lowp.MXScaling(block=4)).codes.tolist()
    )
    with pytest.raises(
        ValueError, match="checkify"
    ):  # staged without checkify: refused at trace time
        f(x)


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, match",
    [
        (np.ones(4, np.float64), "float64"),
        (jnp.ones(4, jnp.int32), "int32"),
        (np.ones(4, bool), "bool"),
        (np.ones(4, np.complex64), "complex64"),
        ([1.0, 2.0], "list"),
        (1.0, "float"),
    ],
)
def test_bad_input_types(x, match):
    with pytest.raises(TypeError, match=match):
        lowp_jax.quantize(x, lowp.TensorScaling())
    with pytest.raises(TypeError, match=match):  # checked before its custom_jvp casts x
        lowp_jax.fake_quantize(x, lowp.TensorScaling())


def test_numpy_scalars_and_int_shapes_are_taken_as_lowp_takes_them():
    scheme = lowp.TensorScaling()
    for x in (np.float32(3.0), np.float16(-0.5), ml_dtypes.bfloat16(2.0)):
        got = lowp_jax.to_lowp(lowp_jax.quantize(x, scheme))
        want = lowp.quantize(x, scheme)
        assert got.codes.tobytes() == want.codes.tobytes() and got.shape == want.shape == ()
    np.testing.assert_array_equal(np.asarray(lowp_jax.random_bits(7, 5)), lowp.random_bits(7, 5))


@pytest.mark.parametrize(
    "shape, scheme, match",
    [
        ((4, 8), lowp.AxisScaling(axis=2), "axis 2"),
        ((8,), lowp.BlockScaling(), "rank >= 2"),
        ((4, 30), lowp.MXScaling(), "block 32 does not divide axis -1 of size 30"),
        ((4, 5), lowp.TensorScaling("float4_e2m1fn"), "even"),
        ((32, 4), lowp.MXScaling("float4_e2m1fn", axis=0), "last axis"),
        ((), lowp.MXScaling(), "rank >= 1"),
    ],
)
def test_bad_shapes_name_the_offending_value(shape, scheme, match):
    with pytest.raises(ValueError, match=match):
        lowp_jax.quantize(jnp.ones(shape), scheme)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"rounding": "up"}, ValueError, "'up'"),
        ({"seed": 1}, ValueError, "stochastic"),
        ({"rounding": "stochastic"}, ValueError, "exactly one"),
        (
            {"rounding": "stochastic", "seed": 1, "random_bits": jnp.zeros(4, jnp.uint32)},
            ValueError,
            "exactly one",
        ),
        (
            {"rounding": "stochastic", "random_bits": jnp.zeros(3, jnp.uint32)},
            ValueError,
            r"\(3,\)",
        ),
        ({"rounding": "stochastic", "random_bits": jnp.zeros(4, jnp.int32)}, TypeError, "uint32"),
        (
            {"rounding": "stochastic", "random_bits": jnp.zeros(4, jnp.uint32), "offset": 1},
            ValueError,
            "offset",
        ),
        ({"rounding": "stochastic", "seed": 1.5}, TypeError, "1.5"),
    ],
)
def test_bad_rounding_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        lowp_jax.quantize(jnp.ones(4), lowp.TensorScaling(), **kwargs)


def test_bad_schemes_and_out_dtypes():
    with pytest.raises(TypeError, match="lowp scheme"):
        lowp_jax.quantize(jnp.ones(4), "mxfp8")
    q = lowp_jax.quantize(jnp.ones(4), lowp.TensorScaling())
    with pytest.raises(ValueError, match="float64"):
        lowp_jax.dequantize(q, "float64")
    with pytest.raises(TypeError, match="QArray"):
        lowp_jax.dequantize(jnp.ones(4))
    assert lowp_jax.dequantize(q, jnp.bfloat16).dtype == jnp.bfloat16


def test_vmap_with_one_seed_repeats_the_bits_and_batched_seeds_do_not():
    x = jnp.full((3, 8), 1.1)
    scheme = lowp.MXScaling(block=8)

    def codes(q):
        return np.asarray(q.codes).view(np.uint8)

    one = jax.vmap(lambda x: lowp_jax.quantize(x, scheme, rounding="stochastic", seed=5))(x)
    assert (codes(one) == codes(one)[0]).all()
    seeds = jnp.arange(3, dtype=jnp.uint32)
    batched = jax.vmap(
        lambda x, seed: lowp_jax.quantize(x, scheme, rounding="stochastic", seed=seed)
    )(x, seeds)
    for i in range(3):
        want = lowp.quantize(np.asarray(x[i]), scheme, rounding="stochastic", seed=i)
        np.testing.assert_array_equal(codes(batched)[i], want.codes)


def test_repr_survives_a_tree_map_that_replaces_the_leaves():
    q = lowp_jax.quantize(np.ones((2, 32), np.float32), lowp.MXScaling())
    shapes = jax.tree_util.tree_map(lambda v: v.shape, q)
    assert "codes=(2, 32)" in repr(shapes) and "scale=(2, 1)" in repr(shapes)
