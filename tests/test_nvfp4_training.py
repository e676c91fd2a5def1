"""NVFP4 training's pieces in the core (spec §3.3, §8): the 16x16 weight tiles, the random
Hadamard transform in its fixed float32 order, and the stochastic-rounding seeds; and that
PyTorch and JAX run the transform to NumPy's bits."""

import dataclasses

import numpy as np
import pytest

import lowp
from lowp import _bits, _hadamard
from lowp.extend import LinearPlan


def _hard_input(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Normal values over many binades, with pairs that cancel to subnormals and exact
    zeros, so that the butterfly's flushes matter."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-20, 20, (rows, cols)))
    x = x.astype(np.float32)
    x[0, 1] = np.nextafter(x[0, 0], np.float32(np.inf))  # x0 - x1: one ulp
    x[1, :16] = np.float32(1.5e-38)  # sums and differences near the subnormal range
    x[1, 1::2] = np.float32(-1.4e-38)
    x[2, :16] = 0.0
    return x


def test_the_transform_is_h16_diag_s_over_4_blockwise():
    s = _hadamard.signs(3, "", (64,))
    x = _hard_input(4, 64)
    x[1:] = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    y = _hadamard.transform_numpy(x, s)
    m = _hadamard.matrix(s)
    np.testing.assert_allclose(m @ m.T, np.eye(16), atol=1e-15)  # orthonormal
    want = (x[1:].reshape(3, 4, 16).astype(np.float64) @ m.T).reshape(3, 64)
    np.testing.assert_allclose(y[1:], want, rtol=0, atol=1e-5)
    # integers stay exact: H16 of 0..15 with s = +1 is 30 (the sum / 4), then -2, -4, 0, -8...
    y = _hadamard.transform_numpy(np.arange(16, dtype=np.float32), np.ones(16, np.float32))
    assert y.tolist() == [30, -2, -4, 0, -8, 0, 0, 0, -16, 0, 0, 0, 0, 0, 0, 0]


def test_signs_are_a_pure_function_of_seed_layer_and_shape():
    s = _hadamard.signs(0, "", (64,))
    assert s.dtype == np.float32 and set(s.tolist()) == {1.0, -1.0}
    assert s.tolist() == [1, 1, 1, 1, 1, -1, 1, 1, 1, -1, -1, -1, 1, 1, 1, 1]  # numerics.md §8
    assert np.array_equal(s, _hadamard.signs(0, "", (64,)))
    for other in (_hadamard.signs(1, "", (64,)), _hadamard.signs(0, "fc1", (64,))):
        assert not np.array_equal(s, other)
    with pytest.raises(TypeError, match="seed must be an int"):
        _hadamard.signs(1.5, "", (64,))
    with pytest.raises(ValueError, match="multiple of 16"):
        _hadamard.transform_numpy(np.ones((2, 24), np.float32), s)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_torch_and_jax_transform_to_numpys_bits(framework):
    s = _hadamard.signs(7, "", (96,))
    x = _hard_input(8, 96, seed=2)
    want = _hadamard.transform_numpy(_bits.ftz(x), s)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        from lowp_torch import _bits as tbits

        got = lowp.extend.hadamard_transform(
            tbits.ftz(torch.from_numpy(x)), torch.from_numpy(s), stack=torch.stack, ftz=tbits.ftz
        ).numpy()
    else:
        jnp = pytest.importorskip("jax.numpy")
        from lowp_jax import _bits as jbits

        got = np.asarray(
            lowp.extend.hadamard_transform(
                jbits.ftz(jnp.asarray(x)), jnp.asarray(s), stack=jnp.stack, ftz=jbits.ftz
            )
        )
    assert got.tobytes() == want.tobytes()


def test_nvfp4_tiles_give_w_and_w_t_the_same_values():
    tile = lowp.NVFP4TileScaling()
    w = np.random.default_rng(4).standard_normal((48, 64)).astype(np.float32)
    q, qt = lowp.quantize(w, tile), lowp.quantize(np.ascontiguousarray(w.T), tile)
    assert q.scale.shape == (3, 4) and np.array_equal(q.scale, qt.scale.T)
    assert q.global_scale == qt.global_scale
    np.testing.assert_array_equal(lowp.dequantize(q), lowp.dequantize(qt).T)
    assert lowp.extend.from_spec(tile.spec) == tile == lowp.NVFP4TileScaling(tile=[16, 16])
    with pytest.raises(ValueError, match=r"tile \(16, 16\) does not divide .*\(40, 64\)"):
        lowp.quantize(np.ones((40, 64), np.float32), tile)
    with pytest.raises(ValueError, match="pair of ints"):
        lowp.NVFP4TileScaling(tile=16)


def test_the_nvfp4_plan_marks_its_stochastic_and_transformed_operands():
    plan = LinearPlan.of(lowp.Recipe.from_name("nvfp4"))
    marks = {
        f"{gemm.name}.{side}": (op.rounding, op.hadamard)
        for gemm in (plan.forward, plan.dgrad, plan.wgrad)
        for side, op in zip("ab", (gemm.a, gemm.b), strict=True)
    }
    assert marks == {
        "forward.a": ("nearest", False),
        "forward.b": ("nearest", False),
        "dgrad.a": ("stochastic", False),
        "dgrad.b": ("nearest", False),
        "wgrad.a": ("stochastic", True),
        "wgrad.b": ("nearest", True),
    }
    assert not any(plan.keeps_codes(t) for t in "xwg")  # packed fp4: every operand its own
    assert plan.wgrad.a.along_first_axis is None  # bits index the transposed copy
    assert plan.wgrad.a.rounding_seed != plan.dgrad.a.rounding_seed
    seeded = LinearPlan.of(dataclasses.replace(plan.recipe, seed=5))
    assert not np.array_equal(seeded.wgrad.a.signs(64), plan.wgrad.a.signs(64))


def test_stochastic_rounding_follows_the_data_and_only_the_data():
    """The dgrad's g is rounded stochastically: not the nearest codes, the same bytes for
    the same g, other bits for another g (the offset is the data's bit sum)."""
    op = LinearPlan.of(lowp.Recipe.from_name("nvfp4")).dgrad.a
    g = np.random.default_rng(5).standard_normal((32, 64)).astype(np.float32)
    q = op.quantize_reference(g)
    assert not np.array_equal(q.codes, lowp.quantize(g, op.scheme).codes)
    assert np.array_equal(q.codes, op.quantize_reference(g.copy()).codes)
    assert lowp.extend.data_offset(_bits.bits(g)) == int(
        g.view(np.uint32).sum(dtype=np.uint64) % 2**32
    )
    # unbiased: over many draws (other data offsets), the mean dequantized value of a
    # fixed element approaches it (1.3 x the block's scale sits between two fp4 codes)
    g2 = g.copy()
    values = []
    for i in range(200):
        g2[-1, -1] = np.float32(i)  # another block: changes the offset, not g2[0, :16]
        values.append(lowp.dequantize(op.quantize_reference(g2))[0, :16])
    exact = lowp.dequantize(lowp.quantize(g, op.scheme))[0, :16]  # same scales, nearest
    mean = np.mean(values, axis=0)
    assert np.abs(mean - g[0, :16]).mean() < 0.5 * np.abs(exact - g[0, :16]).mean()


def test_gemm_spec_checks_the_new_fields():
    nv = lowp.NVFP4Scaling()
    with pytest.raises(ValueError, match="a_rounding must be one of"):
        lowp.GemmSpec(nv, nv, a_rounding="up")
    with pytest.raises(ValueError, match="hadamard applies to quantized GEMMs only"):
        lowp.GemmSpec(None, None, hadamard=True)
    with pytest.raises(TypeError, match="hadamard must be a bool"):
        lowp.GemmSpec(nv, nv, hadamard=1)
    with pytest.raises(TypeError, match="Recipe.seed must be an int"):
        dataclasses.replace(lowp.Recipe.from_name("nvfp4"), seed="0")


def test_the_ablation_variants_take_one_part_of_nvfp4_away():
    """`nvfp4_no_rht`, `nvfp4_no_sr` and `nvfp4_plain` are nvfp4 with the transform, the
    stochastic rounding, or both turned off, and nothing else changed; the sweeps over
    `Recipe.names()` leave them out."""
    base = lowp.Recipe.from_name("nvfp4")
    assert set(lowp.Recipe.ablation_names()).isdisjoint(lowp.Recipe.names())
    for name, stochastic, hadamard in (
        ("nvfp4_no_rht", True, False),
        ("nvfp4_no_sr", False, True),
        ("nvfp4_plain", False, False),
    ):
        rounding = "stochastic" if stochastic else "nearest"
        assert lowp.Recipe.from_name(name) == dataclasses.replace(
            base,
            name=name,
            dgrad=dataclasses.replace(base.dgrad, a_rounding=rounding),
            wgrad=dataclasses.replace(base.wgrad, a_rounding=rounding, hadamard=hadamard),
        )
    with pytest.raises(ValueError, match="unknown recipe 'nvfp4_no'.*ablation variant"):
        lowp.Recipe.from_name("nvfp4_no")


# --- the signs are the same in every layer, replica and framework (spec §8) ---

_M, _K, _N = 32, 64, 32


def _layer_data():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((_M, _K)).astype(np.float32)
    w = (rng.standard_normal((_N, _K)) * 0.1).astype(np.float32)
    g = rng.standard_normal((_M, _N)).astype(np.float32)
    return x, w, g


def _numpy_wgrad_operands(x, g):
    plan = LinearPlan.of(lowp.Recipe.from_name("nvfp4")).wgrad
    assert np.array_equal(plan.a.signs(_M), _hadamard.signs(0, "", (_M,)))
    return (
        plan.a.quantize_reference(np.ascontiguousarray(g.T)),
        plan.b.quantize_reference(np.ascontiguousarray(x.T)),
    )


@pytest.mark.slow
def test_torch_layers_and_replicas_take_the_same_signs_as_numpy():
    """Two differently named layers holding the same weight, and a replica of the model
    built under another torch seed, get the same weight gradient bit for bit (torchao's
    layers each draw their signs, so its replicas disagree); the wgrad operands are
    NumPy's."""
    torch = pytest.importorskip("torch")
    import lowp_torch

    x, w, g = _layer_data()

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(_K, _N, bias=False)
            self.fc2 = torch.nn.Linear(_K, _N, bias=False)

        def forward(self, x):
            return self.fc1(x), self.fc2(x)

    def weight_grads(torch_seed):
        torch.manual_seed(torch_seed)
        model = lowp_torch.convert_to_training(TwoLayers(), "nvfp4", small_shapes="quantize")
        with torch.no_grad():
            model.fc1.weight.copy_(torch.from_numpy(w))
            model.fc2.weight.copy_(torch.from_numpy(w))
        y1, y2 = model(torch.from_numpy(x))
        (torch.sum(y1 * torch.from_numpy(g)) + torch.sum(y2 * torch.from_numpy(g))).backward()
        return model.fc1.weight.grad.numpy(), model.fc2.weight.grad.numpy()

    fc1, fc2 = weight_grads(0)
    replica = weight_grads(1)
    assert fc1.tobytes() == fc2.tobytes() == replica[0].tobytes() == replica[1].tobytes()
    ops = lowp_torch.training_operands(
        torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g), "nvfp4"
    )["wgrad"]
    for got, want in zip(ops, _numpy_wgrad_operands(x, g), strict=True):
        got = lowp_torch.to_lowp(got)
        assert np.array_equal(got.codes, want.codes)
        assert got.scale.tobytes() == want.scale.tobytes()
    product = lowp_torch.scaled_matmul(*ops, out_dtype=torch.float32, kernel="emulated")
    assert product.numpy().tobytes() == fc1.tobytes()


@pytest.mark.slow
def test_jax_layers_and_replicas_take_the_same_signs_as_numpy():
    """The JAX side of the torch test above: two nnx layers, and a replica built from
    other rngs, get the same weight gradient bit for bit; the operands are NumPy's."""
    pytest.importorskip("jax")
    import jax.numpy as jnp
    from flax import nnx

    import lowp_jax

    x, w, g = _layer_data()

    class TwoLayers(nnx.Module):
        def __init__(self, rngs):
            self.fc1 = lowp_jax.nnx.Linear(_K, _N, recipe="nvfp4", use_bias=False, rngs=rngs)
            self.fc2 = lowp_jax.nnx.Linear(_K, _N, recipe="nvfp4", use_bias=False, rngs=rngs)

        def __call__(self, x):
            return self.fc1(x), self.fc2(x)

    def kernel_grads(rng_seed):
        model = TwoLayers(nnx.Rngs(rng_seed))
        model.fc1.kernel.set_value(jnp.asarray(w.T))
        model.fc2.kernel.set_value(jnp.asarray(w.T))

        def loss(m):
            y1, y2 = m(jnp.asarray(x))
            return jnp.sum(y1 * g) + jnp.sum(y2 * g)

        grads = nnx.grad(loss)(model)
        return np.asarray(grads.fc1.kernel.get_value()), np.asarray(grads.fc2.kernel.get_value())

    fc1, fc2 = kernel_grads(0)
    replica = kernel_grads(1)
    assert fc1.tobytes() == fc2.tobytes() == replica[0].tobytes() == replica[1].tobytes()
    ops = lowp_jax.training_operands(jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), "nvfp4")
    for got, want in zip(ops["wgrad"], _numpy_wgrad_operands(x, g), strict=True):
        got = lowp_jax.to_lowp(got)
        assert np.array_equal(got.codes, want.codes)
        assert got.scale.tobytes() == want.scale.tobytes()
