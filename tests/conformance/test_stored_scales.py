"""A stored scale is an input of dequantize's product, so spec §0.2 flushes it: a
hand-made QTensor whose float32 scale (or NVFP4 global scale) is subnormal dequantizes
to the same bits in NumPy, PyTorch and JAX. quantize never stores one (its float scales
are at least EPS / max); a file written elsewhere may."""

import numpy as np
import pytest

import lowp


def _hand_made() -> list[lowp.QTensor]:
    tensor = lowp.quantize(np.full((2, 4), 448.0, np.float32), lowp.TensorScaling())
    nvfp4 = lowp.quantize(np.full((1, 16), 6.0, np.float32), lowp.NVFP4Scaling())
    tiny = np.array(1e-40, np.float32)  # subnormal
    return [
        lowp.QTensor(tensor.codes, tiny, None, lowp.TensorScaling(), (2, 4), "float32"),
        lowp.QTensor(
            nvfp4.codes,
            np.full((1, 1), 0x7E, np.uint8),
            tiny,
            lowp.NVFP4Scaling(),
            (1, 16),
            "float32",
        ),
    ]


@pytest.mark.parametrize("index", [0, 1], ids=["tensor-scale", "nvfp4-global-scale"])
def test_a_subnormal_stored_scale_flushes_in_every_framework(index):
    qt = _hand_made()[index]
    want = lowp.dequantize(qt)
    assert not want.any()  # flushed: the product of a flushed scale is zero
    torch = pytest.importorskip("torch")
    import lowp_torch

    got = lowp_torch.dequantize(lowp_torch.from_lowp(qt)).numpy()
    assert got.tobytes() == want.tobytes()
    del torch
    pytest.importorskip("jax")
    import lowp_jax

    got = np.asarray(lowp_jax.dequantize(lowp_jax.from_lowp(qt)))
    assert got.tobytes() == want.tobytes()
