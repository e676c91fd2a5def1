"""quantize_params refuses a float64 NumPy kernel, as every quantize path does (spec §0.1)."""

import numpy as np
import pytest

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
