"""lowp_jax.ragged_dot (spec §10): the grouped operands' bytes against the NumPy
reference under jit, the GEMMs' SQNR against jax.lax.ragged_dot, the custom VJP."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import lowp
import lowp_jax
from lowp import extend
from lowp_jax import _ragged_dot

RECIPES = ("float8_rowwise", "float8_tensorwise", "mxfp8", "float8_rowwise_gw_hp", "mxfp8_gw_hp")
SIZES = {
    "mixed": [0, 5, 40, 1, 18, 0, 33],
    "one_token": [0, 1, 0],
    "one_expert": [0, 0, 70, 0],
    "odd": [17, 129, 31, 3],
}
SQNR_MIN = {"mxfp8": (27, 25, 24), "float8": (18, 17, 17)}


def _inputs(sizes, k=64, n=32, seed=0):
    rng = np.random.default_rng(seed)
    t = sum(sizes)
    x = (rng.standard_normal((t, k)) * 3).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((len(sizes), n, k)) * 0.1).astype(ml_dtypes.bfloat16)
    g = rng.standard_normal((t, n)).astype(ml_dtypes.bfloat16)
    return x, w, g


_operands = jax.jit(_ragged_dot.grouped_operands, static_argnums=4)


def _slow_unless(fast: bool, *values):
    return pytest.param(*values, marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize(
    "recipe,sizes",
    [
        _slow_unless(sizes == "mixed", recipe, sizes)
        for recipe in ("float8_rowwise", "float8_tensorwise", "mxfp8")
        for sizes in sorted(SIZES)
    ],
)
def test_operands_are_the_reference_bytes(recipe, sizes):
    sizes = SIZES[sizes]
    x, w, g = _inputs(sizes)
    if sum(sizes) > 10:
        x[7, 3] = np.nan
    ops = _operands(x, w, g, np.array(sizes), recipe)
    plan = extend.GroupedPlan.of(lowp.Recipe.from_name(recipe))
    tensors = {"x": x, "w": w, "g": g, "w.T": w.transpose(0, 2, 1), "g.T": g, "x.T": x}
    for gemm in plan.gemms():
        for op, (codes, scale) in zip((gemm.a, gemm.b), ops[gemm.name], strict=True):
            hp = np.ascontiguousarray(tensors[op.tensor])
            ref = extend.quantize_grouped(hp, op.scheme, sizes, op.kind)
            np.testing.assert_array_equal(np.asarray(codes).view(np.uint8), ref.codes)
            got = np.ascontiguousarray(np.asarray(scale)).view(np.uint8)
            np.testing.assert_array_equal(got, ref.scale.view(np.uint8), err_msg=op.tensor)


def _sqnr(a, ref):
    a, ref = np.asarray(a, np.float32), np.asarray(ref, np.float32)
    with np.errstate(divide="ignore"):  # equal: infinite
        return float(20 * np.log10(np.linalg.norm(ref) / np.linalg.norm(a - ref)))


@pytest.mark.parametrize(
    "recipe", [_slow_unless(r in ("float8_rowwise", "mxfp8"), r) for r in RECIPES]
)
def test_sqnr_and_grad_under_jit(recipe):
    sizes = [0, 100, 37, 256, 1, 118]
    x, w, g = _inputs(sizes, k=256, n=128, seed=1)
    lhs, rhs = jnp.asarray(x), jnp.swapaxes(jnp.asarray(w), 1, 2)
    gs, dy = jnp.array(sizes, jnp.int32), jnp.asarray(g)

    def run(lhs, rhs):
        return lowp_jax.ragged_dot(lhs, rhs, gs, recipe=recipe)

    def ref(lhs, rhs):
        return jax.lax.ragged_dot(
            lhs.astype(jnp.float32),
            rhs.astype(jnp.float32),
            gs,
            precision=jax.lax.Precision.HIGHEST,
        )

    out, vjp = jax.vjp(jax.jit(run), lhs, rhs)
    dx, dw = vjp(dy)
    out_ref, vjp_ref = jax.vjp(ref, lhs, rhs)
    dx_ref, dw_ref = vjp_ref(dy.astype(jnp.float32))
    minimum = SQNR_MIN["mxfp8" if recipe.startswith("mx") else "float8"]
    got = (_sqnr(out, out_ref), _sqnr(dx, dx_ref), _sqnr(dw, dw_ref))
    assert all(s >= m for s, m in zip(got, minimum, strict=True)), got
    assert out.dtype == dx.dtype == dw.dtype == jnp.bfloat16
    assert (np.asarray(dw[0], np.float32) == 0).all()  # an expert without tokens


def test_nan_in_one_expert_stays_there():
    sizes = [16, 16, 16]
    x, w, g = _inputs(sizes)
    x[20, 1] = np.inf
    lhs, rhs, gs = jnp.asarray(x), jnp.swapaxes(jnp.asarray(w), 1, 2), jnp.array(sizes)

    def step(lhs, rhs, dy):
        out, vjp = jax.vjp(lambda a, b: lowp_jax.ragged_dot(a, b, gs, recipe="mxfp8"), lhs, rhs)
        return out, vjp(dy)[1]

    out, dw = jax.jit(step)(lhs, rhs, jnp.asarray(g))
    bad = np.isnan(np.asarray(out, np.float32)).any(axis=1)
    assert bad[16:32].any() and not bad[:16].any() and not bad[32:].any()
    bad_w = np.isnan(np.asarray(dw, np.float32)).any(axis=(1, 2))
    assert bad_w.tolist() == [False, True, False]


def test_bad_input_is_named():
    lhs, rhs = jnp.ones((8, 64)), jnp.ones((2, 64, 32))
    with pytest.raises(ValueError, match="sum to 7, the input has 8"):
        lowp_jax.ragged_dot(lhs, rhs, jnp.array([3, 4]))
    with pytest.raises(ValueError, match="group_offset"):
        lowp_jax.ragged_dot(lhs, rhs, jnp.array([4, 4]), group_offset=jnp.array(0))
    with pytest.raises(ValueError, match="dgrad GEMM cannot quantize g along N = 48"):
        lowp_jax.ragged_dot(lhs, jnp.ones((2, 64, 48)), jnp.array([4, 4]), recipe="mxfp8")


@pytest.mark.slow
def test_nnx_grouped_experts_trains_like_bf16():
    nnx = pytest.importorskip("flax.nnx")
    import lowp_jax.nnx

    sizes = jnp.array([10, 0, 33, 21])
    x = jax.random.normal(jax.random.key(0), (64, 64))
    models = {
        r: lowp_jax.nnx.GroupedExperts(64, 128, 4, recipe=r, rngs=nnx.Rngs(0))
        for r in (None, "float8_rowwise")
    }

    @nnx.jit
    def out_and_grads(model):
        return nnx.value_and_grad(lambda m: jnp.mean(m(x, sizes) ** 2), has_aux=False)(model)

    (ref, ref_grads), (got, got_grads) = (
        out_and_grads(models[r]) for r in (None, "float8_rowwise")
    )
    assert abs(float(got) - float(ref)) < 0.05 * float(ref)
    w1, w1_ref = np.asarray(got_grads["w1"][...]), np.asarray(ref_grads["w1"][...])
    assert (w1[1] == 0).all() and _sqnr(w1, w1_ref) > 17
