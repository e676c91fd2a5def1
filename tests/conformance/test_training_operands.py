"""PyTorch and JAX, given the same recipe, weights and batch, quantize every GEMM operand
of a linear layer's forward and backward to identical bytes (issue 6, spec §8).

Both frontends expose the operands their training layers feed the three GEMMs through
`training_operands(x, w, g, recipe)`; each is compared with the other and with the NumPy
reference `lowp.quantize` of that GEMM's orientation of the high-precision tensor.
"""

import numpy as np
import pytest

import lowp

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")
import lowp_jax  # noqa: E402
import lowp_torch  # noqa: E402

# x: (2, 32, 64) -> M = 64, K = 64, N = 96: every dim a multiple of the MX block.
SHAPES = {"x": (2, 32, 64), "w": (96, 64), "g": (2, 32, 96)}


def _inputs(dtype: str):
    rng = np.random.default_rng(6)
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    arrays["w"] *= 0.05
    arrays["g"] *= 1e-3  # gradients are small: the e5m2/e4m3 scales must follow them
    arrays["x"][0, 3] = 0.0  # an all-zero token row
    if dtype == "bfloat16":
        import ml_dtypes

        arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in arrays.items()}
    return arrays


def _reference(arrays, recipe):
    """The NumPy bytes of each GEMM's operands (lowp/_recipes.py orientation)."""
    x = arrays["x"].reshape(-1, SHAPES["x"][-1])
    g = arrays["g"].reshape(-1, SHAPES["g"][-1])
    w = arrays["w"]
    tensors = {"forward": (x, w), "dgrad": (g, w.T), "wgrad": (g.T, x.T)}
    out = {}
    for gemm, (a, b) in tensors.items():
        spec = getattr(recipe, gemm)
        if spec.high_precision:
            out[gemm] = None
            continue
        out[gemm] = (
            lowp.quantize(np.ascontiguousarray(a), spec.a),
            lowp.quantize(np.ascontiguousarray(b), spec.b),
        )
    return out


def _same_bytes(got: lowp.QTensor, want: lowp.QTensor, where: str):
    assert got.scheme == want.scheme, where
    assert got.shape == want.shape, where
    np.testing.assert_array_equal(got.codes.view(np.uint8), want.codes.view(np.uint8), err_msg=f"{where}: codes")
    np.testing.assert_array_equal(
        np.ascontiguousarray(got.scale).view(np.uint8),
        np.ascontiguousarray(want.scale).view(np.uint8),
        err_msg=f"{where}: scales",
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", lowp.Recipe.names())
def test_torch_and_jax_quantize_every_training_gemm_operand_to_the_same_bytes(name, dtype):
    recipe = lowp.Recipe.from_name(name)
    arrays = _inputs(dtype)
    torch_ops = lowp_torch.training_operands(
        *(torch.from_numpy(arrays[k].view(np.uint16)).view(torch.bfloat16) if dtype == "bfloat16"
          else torch.from_numpy(arrays[k]) for k in ("x", "w", "g")),
        recipe,
    )
    jax_ops = lowp_jax.training_operands(*(jnp.asarray(arrays[k]) for k in ("x", "w", "g")), recipe)
    want = _reference(arrays, recipe)
    assert set(torch_ops) == set(jax_ops) == set(want) == {"forward", "dgrad", "wgrad"}
    for gemm, pair in want.items():
        if pair is None:
            assert torch_ops[gemm] is None and jax_ops[gemm] is None, gemm
            continue
        for side, ref, t, j in zip("ab", pair, torch_ops[gemm], jax_ops[gemm]):
            where = f"{name} {dtype} {gemm}.{side}"
            _same_bytes(lowp_torch.to_lowp(t), ref, f"{where} (torch vs numpy)")
            _same_bytes(lowp_jax.to_lowp(j), ref, f"{where} (jax vs numpy)")
