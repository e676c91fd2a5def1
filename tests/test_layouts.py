"""Tier (a): fp4 packing and the cublas_blocked scale layout (spec §5)."""

import numpy as np
import pytest

import lowp


def test_fp4_nibble_order():
    codes = np.array([[0x1, 0x2, 0xF, 0x8]], np.uint8)
    packed = lowp.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x8F]]  # element 2j in bits 3..0, 2j+1 in bits 7..4
    np.testing.assert_array_equal(lowp.unpack_fp4(packed), codes)


def test_fp4_pack_round_trips_every_pair():
    codes = np.stack(np.meshgrid(np.arange(16), np.arange(16)), -1).reshape(-1, 2).astype(np.uint8)
    packed = lowp.pack_fp4(codes)
    assert sorted(packed.reshape(-1).tolist()) == list(range(256))
    np.testing.assert_array_equal(lowp.unpack_fp4(packed), codes)


def test_fp4_pack_refuses_an_odd_last_dim():
    with pytest.raises(ValueError, match="even"):
        lowp.pack_fp4(np.zeros((2, 3), np.uint8))


def blocked_by_formula(scale):
    """The layout element by element, straight from the offset formula."""
    rows, cols = scale.shape
    padded_rows, padded_cols = -(-rows // 128) * 128, -(-cols // 4) * 4
    flat = np.zeros(padded_rows * padded_cols, scale.dtype)
    tiles_per_row = padded_cols // 4
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * tiles_per_row + c // 4
            flat[tile * 512 + (r % 32) * 16 + (r % 128) // 32 * 4 + c % 4] = scale[r, c]
    return flat.reshape(padded_rows, padded_cols)


@pytest.mark.parametrize("rows, cols", [(1, 1), (128, 4), (130, 7), (256, 8), (33, 12)])
def test_cublas_blocked_matches_the_offset_formula(rows, cols):
    scale = np.random.default_rng(rows).integers(1, 255, size=(rows, cols), dtype=np.uint8)
    blocked = lowp.to_cublas_blocked(scale)
    np.testing.assert_array_equal(blocked, blocked_by_formula(scale))
    np.testing.assert_array_equal(lowp.from_cublas_blocked(blocked, rows, cols), scale)


def test_from_cublas_blocked_checks_the_shape():
    with pytest.raises(ValueError, match=r"\(128, 4\)"):
        lowp.from_cublas_blocked(np.zeros((128, 8), np.uint8), 3, 2)


@pytest.mark.parametrize(
    "scheme, shape",
    [
        (lowp.MXScaling(), (3, 5, 64)),
        (lowp.NVFP4Scaling(), (200, 48)),
        (lowp.MXScaling("float4_e2m1fn"), (7, 32)),
    ],
    ids=str,
)
def test_qtensor_layouts_dequantize_identically(scheme, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    q = lowp.quantize(x, scheme)
    blocked = q.with_scale_layout("cublas_blocked")
    rows = int(np.prod(shape[:-1]))
    assert blocked.scale.shape == (-(-rows // 128) * 128, -(-shape[-1] // scheme.block // 4) * 4)
    np.testing.assert_array_equal(blocked.scale, blocked_by_formula(q.scale.reshape(rows, -1)))
    np.testing.assert_array_equal(lowp.dequantize(blocked), lowp.dequantize(q))
    np.testing.assert_array_equal(blocked.with_scale_layout("plain").scale, q.scale)


@pytest.mark.parametrize(
    "scheme, shape, match",
    [
        (lowp.AxisScaling(), (4, 32), "MX and NVFP4"),
        (lowp.MXScaling(axis=0), (32, 4), "last axis"),
    ],
    ids=str,
)
def test_cublas_blocked_applies_to_last_axis_blocks_only(scheme, shape, match):
    q = lowp.quantize(np.ones(shape, np.float32), scheme)
    with pytest.raises(ValueError, match=match):
        q.with_scale_layout("cublas_blocked")
    with pytest.raises(ValueError, match="'swizzled'"):
        q.with_scale_layout("swizzled")
