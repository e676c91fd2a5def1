"""Property-based: the reference against the independent oracle over shapes, magnitudes
from 1e-30 to 1e30, NaN/Inf placement and partial blocks."""

import numpy as np
import oracle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lowp

FORMATS = list(lowp.ELEMENT_FORMATS)


@st.composite
def inputs(draw, last_multiple=1):
    rank = draw(st.integers(1, 4))
    shape = [draw(st.integers(1, 4)) for _ in range(rank - 1)]
    shape.append(last_multiple * draw(st.integers(1, 3)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    exponents = rng.uniform(-30, 30, size=shape)
    x = (rng.choice([-1, 1], size=shape) * 10.0**exponents).astype(np.float32)
    spread = draw(st.sampled_from(["wide", "narrow"]))
    if spread == "narrow":  # one magnitude per tensor: most elements survive the scale
        x = (rng.standard_normal(shape) * 10.0 ** draw(st.integers(-30, 30))).astype(np.float32)
    for special in draw(
        st.lists(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 1e-40]), max_size=3)
    ):
        x.reshape(-1)[rng.integers(x.size)] = special
    return x


def check(x, scheme):
    q = lowp.quantize(x, scheme)
    codes, scale, global_scale = oracle.quantize_nearest(x, scheme)
    got = lowp.unpack_fp4(q.codes) if scheme.fmt == "float4_e2m1fn" else q.codes
    np.testing.assert_array_equal(got, codes)
    np.testing.assert_array_equal(
        q.scale.reshape(-1).view(np.uint8), scale.reshape(-1).view(np.uint8)
    )
    if global_scale is not None:
        assert q.global_scale.view(np.uint32) == np.float32(global_scale).view(np.uint32)
    out = lowp.dequantize(q)
    assert out.shape == x.shape
    finite_groups = ~np.isnan(out)
    assert not np.isinf(out).any()
    assert finite_groups[np.isfinite(x) & ~np.isnan(out)].all()


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    x=inputs(last_multiple=2),
    fmt=st.sampled_from(FORMATS),
    pow2=st.booleans(),
    kind=st.sampled_from(["tensor", "axis", "block"]),
)
def test_float_scales(x, fmt, pow2, kind):
    if kind == "tensor":
        scheme = lowp.TensorScaling(fmt, pow2=pow2)
    elif kind == "axis":
        scheme = lowp.AxisScaling(
            fmt, axis=int(np.random.default_rng(x.size).integers(-x.ndim, x.ndim)), pow2=pow2
        )
    else:
        if x.ndim < 2:
            x = x.reshape(1, -1)
        scheme = lowp.BlockScaling(fmt, block=(2, 4), pow2=pow2)
    check(x, scheme)


@SETTINGS
@given(
    x=inputs(last_multiple=8),
    fmt=st.sampled_from(FORMATS),
    mode=st.sampled_from(["floor", "ceil", "rceil"]),
)
def test_mx(x, fmt, mode):
    check(x, lowp.MXScaling(fmt, block=8, mode=mode))


@SETTINGS
@given(x=inputs(last_multiple=8), global_scale=st.booleans())
def test_nvfp4(x, global_scale):
    check(x, lowp.NVFP4Scaling(block=8, global_scale=global_scale))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_amax_of_every_float32_exponent(fmt):
    """One tensor per float32 exponent: amax 1.5 * 2^e for e in -126..127."""
    schemes = (
        lowp.TensorScaling(fmt),
        lowp.TensorScaling(fmt, pow2=True),
        lowp.MXScaling(fmt, block=4, mode="rceil"),
    )
    for e in range(-126, 128):
        x = np.array([1.5 * 2.0**e, -0.75 * 2.0**e, 2.0**e / 3, 0.0], np.float32)
        for scheme in schemes:
            check(x, scheme)
