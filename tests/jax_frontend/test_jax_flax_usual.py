"""flax models written the usual way (plain nnx.Linear, linen nn.Dense) take quantized
parameters in one documented step, and the wrong ways fail with lowp's fix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

flax = pytest.importorskip("flax")
import flax.linen as nn
from flax import nnx

import lowp_jax
import lowp_jax.linen
import lowp_jax.nnx

X = jax.random.normal(jax.random.key(1), (4, 64), jnp.float32)


class Mlp(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(64, 128, rngs=rngs)
        self.down = nnx.Linear(128, 32, rngs=rngs)

    def __call__(self, x):
        return self.down(nnx.relu(self.up(x)))


@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8", "nvfp4"])
def test_a_plain_nnx_model_converts_in_one_call(preset):
    model = Mlp(nnx.Rngs(0))
    quantized = lowp_jax.nnx.quantize_model(model, preset)
    assert isinstance(quantized.up.kernel[...], lowp_jax.QArray)
    # The same product as lowp's own layer with the same kernels.
    twin = lowp_jax.nnx.Linear(64, 128, config=preset, rngs=nnx.Rngs(0))
    nnx.update(twin, nnx.state(quantized.up))
    np.testing.assert_array_equal(quantized.up(X), twin(X))
    assert quantized(X).shape == (4, 32)


def test_quantized_kernels_in_a_plain_nnx_layer_name_the_fix():
    layer = nnx.Linear(64, 32, rngs=nnx.Rngs(0))
    nnx.update(layer, lowp_jax.quantize_params(nnx.state(layer), "mxfp8"))
    with pytest.raises(TypeError, match=r"lowp_jax\.nnx\.quantize_model\(model, config\)"):
        layer(X)


@pytest.mark.parametrize("preset", ["float8_tensorwise", "mxfp8", "nvfp4"])
def test_a_plain_linen_model_applies_quantized_params_in_the_block(preset):
    model = nn.Sequential([nn.Dense(128), nn.relu, nn.Dense(32)])
    params = model.init(jax.random.key(0), X)
    qparams = lowp_jax.quantize_params(params, preset)
    with lowp_jax.linen.quantized(preset):
        y = jax.jit(model.apply)(qparams, X)
    # lowp's own linen Dense, given the same quantized parameters, computes the same.
    twin = nn.Sequential(
        [lowp_jax.linen.Dense(128, config=preset), nn.relu, lowp_jax.linen.Dense(32, config=preset)]
    )
    np.testing.assert_array_equal(y, twin.apply(qparams, X))
    # High-precision Dense layers in the block run as linen runs them.
    plain = model.apply(params, X)
    with lowp_jax.linen.quantized(preset):
        np.testing.assert_array_equal(model.apply(params, X), plain)


def test_a_kernel_quantized_with_another_scheme_is_refused():
    layer = lowp_jax.nnx.Linear(64, 32, config="float8_rowwise", rngs=nnx.Rngs(0))
    nnx.update(layer, lowp_jax.quantize_params(nnx.state(layer), "mxfp8"))
    with pytest.raises(
        ValueError, match="quantized with MXScaling.*quantizes weights with AxisScaling"
    ):
        layer(X)
    model = nn.Dense(32)
    qparams = lowp_jax.quantize_params(model.init(jax.random.key(0), X), "mxfp8")
    with (
        lowp_jax.linen.quantized("nvfp4"),
        pytest.raises(ValueError, match="^Dense: the QArray kernel was quantized with MXScaling"),
    ):
        model.apply(qparams, X)
