"""Property-based cases on every backend: random schemes, shapes with partial block tiles
and 1-3 blocks per grouped axis, magnitudes over 1e-30 .. 1e30 (per element, or per run
of a block so group maxima spread too), NaN / Inf / signed zeros / subnormals / huge
values at random places, every input dtype and both roundings; each compared byte for
byte with the NumPy reference."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lowp
from lowp_apps.conformance import backends, cases, run

SCHEMES = [
    lowp.TensorScaling("float8_e4m3fn"),
    lowp.TensorScaling("float4_e2m1fn", pow2=True),
    lowp.AxisScaling("float8_e5m2", axis=0),
    lowp.AxisScaling("float6_e3m2fn", pow2=True),
    lowp.BlockScaling("float8_e4m3fn", block=(2, 4)),
    lowp.BlockScaling("float6_e2m3fn", block=(3, 5), pow2=True),
    lowp.MXScaling("float8_e4m3fn", block=8, mode="rceil"),
    lowp.MXScaling("float8_e5m2", block=4, mode="floor", axis=0),
    lowp.MXScaling("float6_e2m3fn", block=8, mode="ceil"),
    lowp.MXScaling("float4_e2m1fn", block=32, mode="rceil"),
    lowp.NVFP4Scaling(),
    lowp.NVFP4Scaling(block=8, global_scale=False),
]
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-39, 3e38, -1e38]


@st.composite
def configured_inputs(draw):
    """(Configuration, input) with a shape the scheme admits."""
    scheme = draw(st.sampled_from(SCHEMES))
    rank = draw(st.integers(2 if isinstance(scheme, lowp.BlockScaling) else 1, 4))
    shape = [draw(st.integers(1, 5)) for _ in range(rank)]
    block = getattr(scheme, "block", None)
    if isinstance(block, int):  # MX / NVFP4: whole blocks along the grouped axis
        shape[scheme.axis % rank] = block * draw(st.integers(1, 3))
    if scheme.fmt == "float4_e2m1fn" and shape[-1] % 2:
        shape[-1] += 1  # fp4 codes pack two a byte along the last axis
    shape = tuple(shape)
    hp_dtype = draw(st.sampled_from(list(cases.HP_DTYPES)))
    rounding = draw(st.sampled_from(["nearest", "stochastic"]))
    seed = draw(st.integers(0, 2**32 - 1))
    chunk = draw(st.sampled_from([None, block if isinstance(block, int) else 4]))
    x = cases.random_magnitudes(shape, seed, chunk).reshape(-1)
    n = math.prod(shape)
    for index, value in draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(SPECIALS)), max_size=3)
    ):
        x[index] = value
    with np.errstate(over="ignore"):  # past float16's range: Inf, one more edge case
        x = x.reshape(shape).astype(cases.HP_DTYPES[hp_dtype])
    return cases.Configuration(scheme, shape, hp_dtype, rounding), x


@pytest.mark.slow
@pytest.mark.parametrize("backend", backends.NAMES, indirect=True)
@settings(
    max_examples=25,
    deadline=None,  # a backend compiles each new shape: seconds, not a hang
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=configured_inputs())
def test_random_cases_match_reference(backend, case):
    config, x = case
    problems = run.check(backend, config, x)
    assert not problems, f"{config.id}:\n  " + "\n  ".join(problems)
