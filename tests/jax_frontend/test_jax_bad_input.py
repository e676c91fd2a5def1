"""lowp_jax refuses what would round twice or fail inside JAX, naming it (issue 23)."""

import numpy as np
import pytest

import lowp
import lowp_jax


def test_quantize_params_refuses_a_float64_numpy_kernel():
    # jnp.asarray(kernel) cast it to float32 first: float64 -> float32 -> float8 rounds twice.
    kernel = np.linspace(-1, 1, 64 * 8).reshape(64, 8)  # float64
    with pytest.raises(TypeError, match="dense.kernel.*float64"):
        lowp_jax.quantize_params({"dense": {"kernel": kernel}}, "float8_rowwise")
    quantized = lowp_jax.quantize_params(
        {"dense": {"kernel": kernel.astype(np.float32)}}, "float8_rowwise"
    )
    assert quantized["dense"]["kernel"].shape == (8, 64)


def test_quantize_names_a_big_endian_array():
    # jnp.asarray failed inside JAX: "Error interpreting argument to stage as a JAX value".
    with pytest.raises(TypeError, match=r"x: a big-endian array \(>f4\)"):
        lowp_jax.quantize(np.ones((2, 32), ">f4"), lowp.MXScaling(), name="x")
