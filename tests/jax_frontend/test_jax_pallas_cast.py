"""The Pallas float8 cast (`lowp_jax._pallas_cast`): its bytes, its sharding, where it runs.

On the CPU the kernel runs under Pallas's interpreter, with the flush, product and
clamp spelled out in JAX operations; on an sm_90 GPU (the GPU tests below, and the GPU
conformance run) with the inline `mul.rn.ftz.f32` and Triton's saturating cast.
"""

import textwrap

import host_devices
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowp
import lowp_jax
from lowp import _formats
from lowp_jax import _bits, _devices, _groups, _pallas_cast, _quantize

SCHEMES = [
    lowp.TensorScaling(),
    lowp.TensorScaling(fmt="float8_e5m2"),
    lowp.TensorScaling(pow2=True),
    lowp.AxisScaling(axis=-1),
    lowp.AxisScaling(axis=-1, fmt="float8_e5m2", pow2=True),
]
ON_SM90 = _devices.sm90_gpus()


def multiplier(x, scheme):
    """Each group's m of spec §3.1, NaN for a poisoned group (what quantize passes)."""
    absb = _bits.ftz_bits(_bits.bits(jnp.asarray(x).astype(jnp.float32))) & _bits.ABS
    amax = _groups.group_max(absb, scheme)
    poisoned = amax >= _bits.INF_BITS
    fmt = _formats.element_format(scheme.fmt)
    m, _ = _quantize._float_scales(jnp.where(poisoned, np.uint32(0), amax), fmt, scheme.pow2)
    return jnp.where(poisoned, np.float32(np.nan), m)


# Specials finite in each input dtype: subnormals of the dtype and of float32, signed
# zeros, the largest normals, float8 maxima.
SPECIALS = {
    "float32": [1e-40, -1e-40, -0.0, 0.0, 3e38, -3e38, 1.1754942e-38, 448.0, -57344.0],
    "float16": [6e-8, -6e-8, -0.0, 0.0, 65504.0, -65504.0, 6.1e-5, 448.0, -57344.0],
}
SPECIALS["bfloat16"] = SPECIALS["float32"]


def edge_values(shape, seed, dtype="float32", kind="specials") -> np.ndarray:
    """Values of `dtype` (returned as that dtype): "wide" spans 10**-3..10**3 so most
    codes are nonzero; "specials" spans the dtype's range and puts SPECIALS first (a
    tensorwise group then holds a huge max, so most of its codes are 0)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    decades = 3 if kind == "wide" else (4 if dtype == "float16" else 8)
    x *= np.float32(10.0) ** rng.integers(-decades, decades + 1, size=shape).astype(np.float32)
    if dtype == "float16":
        x = np.clip(x, -60000.0, 60000.0)
    if kind == "specials":
        flat = x.reshape(-1)
        specials = SPECIALS[dtype]
        flat[: len(specials)] = specials[: flat.size]
    out = np.array(jnp.asarray(x).astype(dtype))  # a writable copy
    assert np.isfinite(out.astype(np.float32)).all()
    return out


def codes_of(x, scheme, native=False):
    fmt = _formats.element_format(scheme.fmt)
    codes = _pallas_cast.cast(
        jnp.asarray(x), multiplier(x, scheme), fmt_name=fmt.name, fmt_max=fmt.max, native=native
    )
    return np.asarray(codes).view(np.uint8)


CASES = [
    (scheme, shape)
    for shape in [(7,), (5, 33), (3, 4, 1500), (130, 1000), (2, 2048)]
    for scheme in SCHEMES
    if len(shape) > 1 or isinstance(scheme, lowp.TensorScaling)  # the kernel's rows need rank 2
]


@pytest.mark.parametrize(("scheme", "shape"), CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["wide", "specials"])
def test_interpreted_kernel_writes_lowps_bytes(scheme, shape, dtype, kind):
    """Tiles with masked edges (33, 1500, 1000 are not powers of two), subnormal, huge
    and signed-zero inputs: the codes are `lowp.quantize`'s."""
    x = edge_values(shape, seed=len(shape), dtype=dtype, kind=kind)
    want = lowp.quantize(x.astype(np.float32), scheme).codes.view(np.uint8)
    got = codes_of(x, scheme)
    np.testing.assert_array_equal(got, want)
    if kind == "wide":  # most codes nonzero: the comparison is not of zeros
        assert np.count_nonzero(got) > got.size // 2


@pytest.mark.parametrize("scheme", [lowp.TensorScaling(), lowp.AxisScaling(axis=-1)], ids=str)
def test_a_poisoned_group_is_code_zero(scheme):
    x = edge_values((6, 40), seed=3, kind="wide")
    x[2, 7] = np.nan
    x[4, 1] = -np.inf
    codes = codes_of(x, scheme)
    want = lowp.quantize(x, scheme)
    np.testing.assert_array_equal(codes, want.codes.view(np.uint8))
    if isinstance(scheme, lowp.AxisScaling):
        assert not codes[[2, 4]].any() and codes[[0, 1, 3, 5]].any()
    else:
        assert not codes.any()


def test_the_interpreted_kernel_under_vmap_jit_and_grad():
    """A batch of tensors (batched multiplier, shared multiplier, nested vmap, an empty
    batch) gives each tensor lowp's codes for its own scale; grad through a
    stop_gradient input is zero."""

    def cast(x, m):
        return _pallas_cast.cast(x, m, fmt_name="float8_e4m3fn", fmt_max=448.0, native=False)

    scheme = lowp.TensorScaling()
    x = jnp.asarray(edge_values((3, 8, 40), seed=9, kind="wide"))
    x = x.at[2, 1, 1].set(jnp.nan)  # the third tensor is poisoned
    m = jnp.stack([multiplier(x[i], scheme).reshape(1, 1) for i in range(3)])
    want = [lowp.quantize(np.asarray(x[i]), scheme).codes.view(np.uint8) for i in range(3)]
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(cast))(x, m)).view(np.uint8), want)
    shared = jax.vmap(cast, in_axes=(0, None))(x[:2], m[0])
    np.testing.assert_array_equal(np.asarray(shared[0]).view(np.uint8), want[0])
    nested = jax.vmap(jax.vmap(cast))(
        x.reshape(3, 2, 4, 40), jnp.broadcast_to(m[:, None], (3, 2, 1, 1))
    )
    np.testing.assert_array_equal(np.asarray(nested).view(np.uint8).reshape(3, 8, 40), want)
    assert jax.vmap(cast)(jnp.zeros((0, 8, 40)), jnp.ones((0, 1, 1))).shape == (0, 8, 40)
    g = jax.grad(lambda a: jnp.sum(cast(jax.lax.stop_gradient(a), m[0]).astype(jnp.float32)))(x[0])
    assert not np.asarray(g).any()


def test_a_multiplier_of_another_shape_is_refused_by_name():
    with pytest.raises(ValueError, match=r"multiplier: shape \(3, 1\)"):
        _pallas_cast.cast(
            jnp.ones((4, 8)),
            jnp.ones((3, 1)),
            fmt_name="float8_e4m3fn",
            fmt_max=448.0,
            native=False,
        )


def test_where_the_kernel_applies(monkeypatch):
    """float8, one scale or one per last-axis row, 1 to 2**31 - 1 elements, and every
    GPU sm_90+ (faked here; `applies` is what quantize asks when lowering for CUDA)."""
    shape = (64, 128)
    monkeypatch.setattr(_devices, "sm90_gpus", lambda: True)
    assert _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", shape)
    assert _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", (7,))
    assert _pallas_cast.applies(lowp.AxisScaling(axis=-1), "float8_e5m2", shape)
    assert _pallas_cast.applies(lowp.AxisScaling(axis=1), "float8_e5m2", shape)
    assert not _pallas_cast.applies(lowp.AxisScaling(axis=0), "float8_e4m3fn", shape)
    assert not _pallas_cast.applies(lowp.AxisScaling(axis=-1), "float8_e4m3fn", (7,))
    assert not _pallas_cast.applies(lowp.TensorScaling(fmt="float6_e3m2fn"), "float6_e3m2fn", shape)
    assert not _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", (0, 4))
    assert not _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", (2**16, 2**15))
    assert not _pallas_cast.applies(lowp.MXScaling(), "float8_e4m3fn", shape)
    monkeypatch.setattr(_pallas_cast, "ENABLED", False)
    assert not _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", shape)
    monkeypatch.setattr(_pallas_cast, "ENABLED", True)
    monkeypatch.setattr(_devices, "sm90_gpus", lambda: False)
    assert not _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", shape)


_SHARDED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import lowp
    from lowp_jax import _pallas_cast
    from test_jax_pallas_cast import codes_of, edge_values, multiplier

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    x = edge_values((64, 96), seed=5)
    for scheme in (lowp.TensorScaling(), lowp.AxisScaling(axis=-1)):
        m = multiplier(x, scheme)
        for spec in (P("data", None), P("data", "model"), P(None, "model")):
            xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))
            f = jax.jit(lambda a, m: _pallas_cast.cast(
                a, m, fmt_name="float8_e4m3fn", fmt_max=448.0, native=False))
            text = f.lower(xs, m).compile().as_text()
            assert "all-gather" not in text, (scheme, spec)
            got = f(xs, m)
            assert got.sharding.is_equivalent_to(NamedSharding(mesh, spec), 2), got.sharding
            assert np.array_equal(np.asarray(got).view(np.uint8), codes_of(x, scheme))

    # quantize inside shard_map, over all mesh axes or some, on a machine that has the
    # kernel (faked): each device's cast runs XLA's form there, and the bytes are lowp's.
    import lowp_jax
    from lowp_jax import _devices
    _devices.sm90_gpus = lambda: True
    x = edge_values((64, 96), seed=6, kind="wide")
    for scheme in (lowp.TensorScaling(), lowp.AxisScaling(axis=-1)):
        def per_shard(a):
            return jax.lax.bitcast_convert_type(lowp_jax.quantize(a, scheme).codes, jnp.uint8)
        for axes in ({"data", "model"}, {"data"}):
            f = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=P("data", None),
                                      out_specs=P("data", None), axis_names=axes))
            got = np.asarray(f(jnp.asarray(x)))
            for i in range(2):
                rows = x[32 * i:32 * (i + 1)]
                want = lowp.quantize(rows, scheme).codes.view(np.uint8)
                assert np.array_equal(got[32 * i:32 * (i + 1)], want), (scheme, axes, i)
        batch = jax.vmap(lambda a: lowp_jax.quantize(a, scheme).codes)(jnp.zeros((0, 8, 40)))
        assert batch.shape == (0, 8, 40)
    print("sharded ok")
    """
)


def test_a_sharded_input_is_cast_shard_by_shard():
    """Over 4 host devices (a subprocess: jax fixes the device count when it starts),
    sharded by rows, columns or both: no all-gather, the input's sharding kept, the
    unsharded bytes."""
    stdout = host_devices.run_on_four_cpu_devices(_SHARDED)
    assert "sharded ok" in stdout


# --- on an sm_90 GPU: the PTX kernel ---------------------------------------------------

needs_sm90 = pytest.mark.skipif(
    not ON_SM90, reason="needs an NVIDIA GPU of compute capability >= 9.0 (the PTX kernel)"
)


@needs_sm90
@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["wide", "specials"])
def test_quantize_runs_the_kernel_on_the_gpu(scheme, dtype, kind):
    """`lowp_jax.quantize` lowers to the kernel and writes lowp's bytes, codes and scales."""
    x = jnp.asarray(edge_values((96, 1000), seed=11, dtype=dtype, kind=kind))
    x = x.at[5, 3].set(jnp.nan)
    fn = jax.jit(lambda a: lowp_jax.quantize(a, scheme))
    assert "lowp_float8_cast" in fn.lower(x).compile().as_text()
    got = lowp_jax.to_lowp(fn(x))
    want = lowp.quantize(np.asarray(x.astype(jnp.float32)), scheme)
    np.testing.assert_array_equal(got.codes.view(np.uint8), want.codes.view(np.uint8))
    np.testing.assert_array_equal(
        np.asarray(got.scale, np.float32).view(np.uint32),
        np.asarray(want.scale, np.float32).view(np.uint32),
    )


@needs_sm90
def test_the_kernel_under_vmap_and_grad():
    """vmap of quantize (a batch of tensors, each its own scale) and grad through the
    dequantized value (zero: quantize carries no gradient) both run the kernel."""
    xs = jnp.asarray(edge_values((3, 64, 128), seed=12, kind="wide"))
    scheme = lowp.TensorScaling()
    batched = jax.vmap(lambda a: lowp_jax.quantize(a, scheme).codes)(xs)
    for i in range(3):
        want = lowp.quantize(np.asarray(xs[i]), scheme).codes.view(np.uint8)
        np.testing.assert_array_equal(np.asarray(batched[i]).view(np.uint8), want)
    g = jax.grad(lambda a: jnp.sum(lowp_jax.quantize(a, scheme).dequantize()))(xs[0])
    assert not np.asarray(g).any()


@pytest.mark.skipif(
    not ON_SM90 or len(jax.devices()) < 2,
    reason="needs two NVIDIA GPUs of compute capability >= 9.0",
)
@pytest.mark.parametrize("scheme", [lowp.TensorScaling(), lowp.AxisScaling(axis=-1)], ids=str)
def test_a_sharded_quantize_casts_each_shard_on_its_gpu(scheme):
    """Rows over two GPUs: the amax is reduced across them, the kernel casts each
    device's rows where they lie (no all-gather), and the bytes are the unsharded ones."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    x = jnp.asarray(edge_values((256, 1000), seed=13, dtype="bfloat16", kind="wide"))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    fn = jax.jit(lambda a: lowp_jax.quantize(a, scheme))
    text = fn.lower(xs).compile().as_text()
    assert "lowp_float8_cast" in text and "all-gather" not in text
    got = fn(xs)
    assert got.codes.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2)
    want = lowp.quantize(np.asarray(x.astype(jnp.float32)), scheme)
    np.testing.assert_array_equal(np.asarray(got.codes).view(np.uint8), want.codes.view(np.uint8))
