"""The Pallas float8 cast (`lowp_jax._pallas_cast`): its bytes, its sharding, where it runs.

On the CPU the kernel runs under Pallas's interpreter, with the flush, product and
clamp spelled out in JAX operations; on an sm_90 GPU (the GPU tests below, and the GPU
conformance run) with the inline `mul.rn.ftz.f32` and Triton's saturating cast. The
transposed cast (`quantize_transposed`, x.T's rowwise codes written from x) is checked
both ways too, and through the training backward that uses it.
"""

import contextlib
import functools
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_a_transposed_multiplier_of_another_shape_is_refused_by_name():
    """The transposed cast takes one multiplier per column of x, and nothing else."""
    for x_shape, m_shape in [((4, 8), (4, 1)), ((4, 8), (1, 1)), ((8,), (1, 8))]:
        with pytest.raises(ValueError, match=r"is not one per column of x"):
            _pallas_cast.cast(
                jnp.ones(x_shape),
                jnp.ones(m_shape),
                fmt_name="float8_e4m3fn",
                fmt_max=448.0,
                native=False,
                transposed=True,
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
    columns = lowp.AxisScaling(axis=0)  # the transposed cast: one scale per column of x
    assert _pallas_cast.applies(columns, "float8_e4m3fn", shape, transposed=True)
    assert _pallas_cast.applies(lowp.AxisScaling(axis=-2), "float8_e5m2", (1, 7), transposed=True)
    assert not _pallas_cast.applies(
        lowp.AxisScaling(axis=-1), "float8_e4m3fn", shape, transposed=True
    )
    assert not _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", shape, transposed=True)
    assert not _pallas_cast.applies(columns, "float8_e4m3fn", (7,), transposed=True)
    assert not _pallas_cast.applies(columns, "float8_e4m3fn", (2**16, 2**15), transposed=True)
    assert not _pallas_cast.applies(
        lowp.AxisScaling(axis=0, fmt="float6_e3m2fn"), "float6_e3m2fn", shape, transposed=True
    )
    with lowp_jax.cast_kernels("xla"):
        assert not _pallas_cast.applies(lowp.TensorScaling(), "float8_e4m3fn", shape)
        assert not _pallas_cast.applies(columns, "float8_e4m3fn", shape, transposed=True)
    with lowp_jax.cast_kernels("auto", transposed=False):  # the row kernel stays
        assert _pallas_cast.applies(lowp.AxisScaling(axis=-1), "float8_e5m2", shape)
        assert not _pallas_cast.applies(columns, "float8_e4m3fn", shape, transposed=True)
    assert _pallas_cast.applies(columns, "float8_e4m3fn", shape, transposed=True)
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


@pytest.mark.slow
def test_a_sharded_input_is_cast_shard_by_shard():
    """Over 4 host devices (a subprocess: jax fixes the device count when it starts),
    sharded by rows, columns or both: no all-gather, the input's sharding kept, the
    unsharded bytes."""
    stdout = host_devices.run_on_four_cpu_devices(_SHARDED)
    assert "sharded ok" in stdout


# --- the transposed cast: x.T's rowwise codes, written by the kernel from x ------------

ROWWISE_OF_TRANSPOSE = [
    lowp.AxisScaling(axis=-1),
    lowp.AxisScaling(axis=1, pow2=True),
    lowp.AxisScaling(axis=-1, fmt="float8_e5m2"),
    lowp.AxisScaling(axis=-1, fmt="float8_e5m2", pow2=True),
]
# Masked tile edges on both axes (33, 70, 130, 1000 are not powers of two), one row,
# one column.
TRANSPOSED_SHAPES = [(5, 33), (130, 70), (96, 1000), (1, 37), (37, 1)]


def _clear_traces():
    _quantize._quantize.clear_cache()
    _quantize._quantize_transposed.clear_cache()


@contextlib.contextmanager
def interpreted_kernel():
    """lowp_jax on the CPU as on an sm_90 GPU, with the kernels run by Pallas's
    interpreter: the machine faked sm_90 (what `applies` asks), the CUDA branch of
    `lax.platform_dependent` taken, and `_pallas_cast.cast` run with native=False. The
    jitted quantizers are retraced on entry and on exit (a cached trace holds a branch)."""
    cast = _pallas_cast.cast
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_devices, "sm90_gpus", lambda: True)
        patch.setattr(jax.lax, "platform_dependent", lambda *args, cuda, default: cuda(*args))
        patch.setattr(
            _pallas_cast, "cast", lambda *args, **kwargs: cast(*args, **kwargs | {"native": False})
        )
        _clear_traces()
        try:
            yield
        finally:
            _clear_traces()


def kernel_calls(fn, *args) -> int:
    """How many transposed cast kernels `fn(*args)` traces to."""
    return str(jax.make_jaxpr(fn)(*args)).count("name=lowp_float8_cast_transposed")


def column_cases(shape, dtype, seed=0) -> np.ndarray:
    """edge_values "wide" (most codes nonzero) with whole columns set to what a column
    scale meets: all zeros; the dtype's smallest subnormal (a float32 subnormal flushes
    to an amax of 0); a NaN and an Inf (poisoned); the dtype's specials (a huge amax,
    subnormals and signed zeros beside it). Column 0 stays wide."""
    x = edge_values(shape, seed=seed, dtype=dtype, kind="wide").astype(np.float32)
    rows, cols = shape
    specials = np.resize(np.array(SPECIALS[dtype], np.float32), rows)
    tiny = np.float32(SPECIALS[dtype][0])
    edits = [
        np.zeros(rows, np.float32),
        np.where(np.arange(rows) % 2 == 0, tiny, -tiny).astype(np.float32),
        np.where(np.arange(rows) == rows // 2, np.nan, x[:, 0]),
        np.where(np.arange(rows) == rows - 1, -np.inf, x[:, 0]),
        specials,
    ]
    for column, values in enumerate(edits[: cols - 1], start=1):
        x[:, column] = values
    return np.asarray(jnp.asarray(x).astype(dtype))


def _same_qarray(got, want):
    """Equal QArrays, byte for byte: codes, scale, scheme, shape and hp_dtype."""
    assert (got.scheme, got.shape, got.hp_dtype) == (want.scheme, want.shape, want.hp_dtype)
    for leaf in ("codes", "scale"):
        a, b = np.asarray(getattr(got, leaf)), np.asarray(getattr(want, leaf))
        assert (a.dtype, a.shape) == (b.dtype, b.shape), leaf
        np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))


def _same_as_lowp(q, x, scheme):
    """q's codes and scale bytes are `lowp.quantize`'s (NumPy) of x.T."""
    want = lowp.quantize(np.ascontiguousarray(x.astype(np.float32).T), scheme)
    got = lowp_jax.to_lowp(q)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.codes.view(np.uint8), want.codes.view(np.uint8))
    np.testing.assert_array_equal(
        np.asarray(got.scale, np.float32).view(np.uint32),
        np.asarray(want.scale, np.float32).view(np.uint32),
    )


@pytest.mark.slow
@pytest.mark.parametrize("shape", TRANSPOSED_SHAPES, ids=str)
@pytest.mark.parametrize("scheme", ROWWISE_OF_TRANSPOSE, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_interpreted_quantize_transposed_is_quantize_of_the_transpose(shape, scheme, dtype):
    """The kernel's path (column maxima on x, the codes stored transposed) gives the
    QArray of `quantize(x.T)` and the bytes of `lowp.quantize(x.T)`: zero, subnormal,
    NaN, Inf and special columns included."""
    x = column_cases(shape, dtype)
    with interpreted_kernel():
        got = _quantize.quantize_transposed(jnp.asarray(x), scheme, name="x.T")
        assert kernel_calls(functools.partial(_quantize.quantize_transposed, scheme=scheme), x) == 1
    _same_qarray(got, lowp_jax.quantize(jnp.asarray(x).T, scheme))
    _same_as_lowp(got, x, scheme)
    if shape[1] > 1 and shape[0] > 1:  # poisoned columns: NaN scale, codes 0
        codes = np.asarray(got.codes).view(np.uint8)
        assert np.isnan(np.asarray(got.scale)[[3, 4]]).all() and not codes[[3, 4]].any()
    if shape[1] == 1:  # the one wide column: most codes nonzero
        assert np.count_nonzero(np.asarray(got.codes).view(np.uint8)) > shape[0] // 2


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_interpreted_transposed_cast_writes_lowps_bytes(dtype):
    """`_pallas_cast.cast(transposed=True)` alone: each column's multiplier, the tile
    stored transposed, and a NaN multiplier's column all code 0."""
    x = column_cases((130, 70), dtype, seed=4)
    columns = lowp.AxisScaling(axis=0)
    m = multiplier(x, columns)
    codes = _pallas_cast.cast(
        jnp.asarray(x), m, fmt_name="float8_e4m3fn", fmt_max=448.0, native=False, transposed=True
    )
    assert codes.shape == (70, 130) and codes.dtype == jnp.float8_e4m3fn
    want = lowp.quantize(np.ascontiguousarray(x.astype(np.float32).T), lowp.AxisScaling())
    np.testing.assert_array_equal(np.asarray(codes).view(np.uint8), want.codes.view(np.uint8))


@pytest.mark.slow
def test_quantize_transposed_elsewhere_is_quantize_of_the_transpose():
    """Where the kernel does not apply (a machine without an sm_90 GPU; anywhere, a
    scheme it does not take) quantize_transposed is quantize(x.T): the same QArray, no
    transposed kernel; rank and input checks name the tensor."""
    x = jnp.asarray(column_cases((64, 96), "bfloat16", seed=2))
    others = [
        lowp.TensorScaling(),
        lowp.AxisScaling(axis=0),  # along x.T's first axis: per row of x
        lowp.BlockScaling(block=(32, 32)),
        lowp.MXScaling(),
        lowp.AxisScaling(fmt="float6_e3m2fn"),
    ]
    # without an sm_90 GPU the kernel applies nowhere; on one, rows of x.T take it
    for scheme in others if ON_SM90 else [lowp.AxisScaling(), *others]:
        assert kernel_calls(functools.partial(_quantize.quantize_transposed, scheme=scheme), x) == 0
        _same_qarray(_quantize.quantize_transposed(x, scheme), lowp_jax.quantize(x.T, scheme))
    with interpreted_kernel():
        for scheme in others:
            assert (
                kernel_calls(functools.partial(_quantize.quantize_transposed, scheme=scheme), x)
                == 0
            )
            got = _quantize.quantize_transposed(x, scheme)
            _same_qarray(got, lowp_jax.quantize(x.T, scheme))
    with pytest.raises(ValueError, match=r"w\.T: quantize_transposed takes a rank-2 array"):
        _quantize.quantize_transposed(jnp.ones((2, 3, 4)), lowp.AxisScaling(), name="w.T")
    with pytest.raises(TypeError, match=r"w\.T: lowp_jax\.quantize takes a JAX or NumPy"):
        _quantize.quantize_transposed([[1.0]], lowp.AxisScaling(), name="w.T")


def pallas_launches(jaxpr) -> int:
    """Pallas kernel launches in a jaxpr, nested jaxprs included (each launch counted,
    however the printer shares equal ones)."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            count += 1
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's, or a Jaxpr
                if hasattr(inner, "eqns"):
                    count += pallas_launches(inner)
    return count


@pytest.mark.slow
@pytest.mark.parametrize("groups", ["tensor", "rows", "columns (transposed)"])
def test_a_batch_past_the_int32_offsets_is_cast_in_launches(monkeypatch, groups):
    """Under vmap the kernel sees the whole batch (`_cast_local` of a (5, 40, 24) x here),
    which may reach MAX_ELEMENTS, its int32 offsets' limit, though each tensor passed
    `applies`: it is then cast in launches of whole rows or matrices below that, each
    with its own multipliers (or the one shared), to the same bytes. MAX_ELEMENTS is
    cut to two tensors' worth plus one; the kernel is interpreted."""
    transposed = groups.startswith("columns")
    rng = np.random.default_rng(7)
    xs = jnp.asarray(np.stack([column_cases((40, 24), "float32", seed=i) for i in range(5)]))
    m_shape = {"tensor": (1, 1, 1), "rows": (5, 40, 1), "columns (transposed)": (5, 1, 24)}
    ms = rng.uniform(0.5, 2.0, m_shape[groups]).astype(np.float32)
    if groups != "tensor":
        ms.reshape(-1)[-1] = np.nan  # the last tensor's last group is poisoned: code 0
    ms = jnp.asarray(ms)

    def local():  # a new function each time: a traced one is cached by identity
        return lambda x, m: _pallas_cast._cast_local(
            x, m, "float8_e4m3fn", 448.0, False, transposed
        )

    assert pallas_launches(jax.make_jaxpr(local())(xs, ms).jaxpr) == 1
    want = np.asarray(local()(xs, ms)).view(np.uint8)
    monkeypatch.setattr(_pallas_cast, "MAX_ELEMENTS", 2 * 40 * 24 + 1)
    assert pallas_launches(jax.make_jaxpr(local())(xs, ms).jaxpr) == 3
    got = np.asarray(local()(xs, ms)).view(np.uint8)
    np.testing.assert_array_equal(got, want)
    for i in range(5):  # each tensor by the public cast: the batch's codes are its own
        m = ms[0, 0, 0] if groups == "tensor" else ms[i]
        alone = _pallas_cast.cast(
            xs[i], m, fmt_name="float8_e4m3fn", fmt_max=448.0, native=False, transposed=transposed
        )
        np.testing.assert_array_equal(got[i], np.asarray(alone).view(np.uint8))
    if groups != "tensor":
        assert not got[-1, -1].any()  # the poisoned group: x's last row (or column)


@pytest.mark.slow
def test_the_interpreted_transposed_cast_under_vmap_jit_and_grad():
    """A batch of matrices (batched multipliers, shared multipliers, nested vmap, an
    empty batch) gives each its own transposed codes; vmap and grad of
    quantize_transposed run the kernel and match quantize(x.T)."""

    def cast(x, m):
        return _pallas_cast.cast(
            x, m, fmt_name="float8_e4m3fn", fmt_max=448.0, native=False, transposed=True
        )

    columns = lowp.AxisScaling(axis=0)
    xs = jnp.asarray(np.stack([column_cases((40, 24), "float32", seed=i) for i in range(3)]))
    m = jnp.stack([multiplier(xs[i], columns) for i in range(3)])
    want = [
        lowp.quantize(np.ascontiguousarray(np.asarray(xs[i]).T), lowp.AxisScaling()).codes
        for i in range(3)
    ]
    want = np.stack(want).view(np.uint8)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(cast))(xs, m)).view(np.uint8), want)
    shared = jax.vmap(cast, in_axes=(0, None))(jnp.stack([xs[0], xs[0]]), m[0])
    np.testing.assert_array_equal(np.asarray(shared[1]).view(np.uint8), want[0])
    nested = jax.vmap(jax.vmap(cast))(xs[None], m[None])
    np.testing.assert_array_equal(np.asarray(nested[0]).view(np.uint8), want)
    assert jax.vmap(cast)(jnp.zeros((0, 40, 24)), jnp.ones((0, 1, 24))).shape == (0, 24, 40)

    scheme = lowp.AxisScaling(pow2=True)
    with interpreted_kernel():
        batched = jax.vmap(lambda a: _quantize.quantize_transposed(a, scheme))(xs)
        assert kernel_calls(jax.vmap(lambda a: _quantize.quantize_transposed(a, scheme)), xs) == 1
        g = jax.grad(
            lambda a: jnp.sum(_quantize.quantize_transposed(a, scheme).dequantize(jnp.float32))
        )(xs[0])
    for i in range(3):
        _same_qarray(
            jax.tree.map(lambda leaf, i=i: leaf[i], batched), lowp_jax.quantize(xs[i].T, scheme)
        )
    assert not np.asarray(jnp.nan_to_num(g)).any()


@pytest.mark.slow
@pytest.mark.parametrize("hp_dtype", ["float32", "bfloat16"])
def test_training_operands_and_gradients_are_unchanged_by_the_transposed_kernel(hp_dtype):
    """float8_rowwise's backward quantizes w.T, dy.T and x.T rowwise: with the kernels
    (interpreted) its three transposed operands come from the transposed cast, and every
    operand, y, dx and dw are bit for bit those of XLA's path (this CPU), the operands
    lowp's (NumPy) bytes."""
    recipe = "float8_rowwise"
    rng = np.random.default_rng(8)
    x, w, g = (
        jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(hp_dtype)
        for shape in ((2, 32, 64), (96, 64), (2, 32, 96))
    )
    x = x.at[0, 3].set(0.0)  # an all-zero token: a zero column of x.T

    def step(x, w, g):
        y, vjp = jax.vjp(
            lambda x, w: lowp_jax.training_dot_general(
                x, w, (((2,), (1,)), ((), ())), recipe=recipe, small_shapes="quantize"
            ),
            x,
            w,
        )
        return (y, *vjp(g))

    def operands(x, w, g):
        return lowp_jax.training_operands(x, w, g, recipe)

    want_step, want_ops = step(x, w, g), operands(x, w, g)
    with interpreted_kernel():
        assert kernel_calls(operands, x, w, g) == 3
        assert kernel_calls(step, x, w, g) == 3
        got_step, got_ops = jax.jit(step)(x, w, g), operands(x, w, g)
    for got, want in zip(got_step, want_step, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    for gemm in ("forward", "dgrad", "wgrad"):
        for got, want in zip(got_ops[gemm], want_ops[gemm], strict=True):
            _same_qarray(got, want)
    xn, wn, gn = (np.asarray(t.astype(jnp.float32)).reshape(-1, t.shape[-1]) for t in (x, w, g))
    spec = lowp.Recipe.from_name(recipe)
    for q, hp, scheme in [
        (got_ops["dgrad"][1], wn, spec.dgrad.b),
        (got_ops["wgrad"][0], gn, spec.wgrad.a),
        (got_ops["wgrad"][1], xn, spec.wgrad.b),
    ]:
        _same_as_lowp(q, hp, scheme)


_SHARDED_TRANSPOSED = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import lowp
    import lowp_jax
    from lowp_jax import _pallas_cast, _quantize
    from test_jax_pallas_cast import column_cases, interpreted_kernel, kernel_calls, multiplier

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
    x = column_cases((64, 96), "bfloat16", seed=5)
    m = multiplier(x, lowp.AxisScaling(axis=0))
    want = lowp.quantize(np.ascontiguousarray(x.astype(np.float32).T), lowp.AxisScaling())
    f = jax.jit(lambda a, m: _pallas_cast.cast(
        a, m, fmt_name="float8_e4m3fn", fmt_max=448.0, native=False, transposed=True))
    for spec, codes_spec in ((P("data", None), P(None, "data")),
                             (P("data", "model"), P("model", "data")),
                             (P(None, "model"), P("model", None))):
        xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))
        text = f.lower(xs, m).compile().as_text()
        assert "all-gather" not in text, spec
        got = f(xs, m)
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, codes_spec), 2), got.sharding
        assert np.array_equal(np.asarray(got).view(np.uint8), want.codes.view(np.uint8)), spec

    # quantize_transposed of a sharded x with the kernel (interpreted): the column maxima
    # reduced across devices, each device's tile cast where it lies, lowp's bytes.
    scheme = lowp.AxisScaling()
    with interpreted_kernel():
        for spec in (P("data", None), P("data", "model")):
            xs = jax.device_put(jnp.asarray(x), NamedSharding(mesh, spec))
            g = jax.jit(lambda a: _quantize.quantize_transposed(a, scheme))
            assert kernel_calls(g, xs) == 1
            assert "all-gather" not in g.lower(xs).compile().as_text(), spec
            q = g(xs)
            assert np.array_equal(np.asarray(q.codes).view(np.uint8), want.codes.view(np.uint8))
            assert np.array_equal(np.asarray(q.scale).view(np.uint32), want.scale.view(np.uint32))

        # inside shard_map the kernel does not apply: quantize(x.T) runs, per shard.
        def per_shard(a):
            q = _quantize.quantize_transposed(a, scheme)
            return jax.lax.bitcast_convert_type(q.codes, jnp.uint8)
        h = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=P("data", None),
                                  out_specs=P(None, "data")))
        assert kernel_calls(h, jnp.asarray(x)) == 0
        got = np.asarray(h(jnp.asarray(x)))
        for i in range(2):
            rows = x[32 * i:32 * (i + 1)].astype(np.float32)
            part = lowp.quantize(np.ascontiguousarray(rows.T), scheme).codes.view(np.uint8)
            assert np.array_equal(got[:, 32 * i:32 * (i + 1)], part), i
    print("sharded transposed ok")
    """
)


@pytest.mark.slow
def test_a_sharded_input_is_cast_transposed_shard_by_shard():
    """Over 4 host devices (a subprocess): the transposed cast of x sharded by rows,
    columns or both keeps each device's tile where it lies (no all-gather), its codes
    sharded with the axes swapped; quantize_transposed of a sharded x runs the kernel
    and writes lowp's bytes, and inside shard_map falls back to quantize(x.T)."""
    stdout = host_devices.run_on_four_cpu_devices(_SHARDED_TRANSPOSED)
    assert "sharded transposed ok" in stdout


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


_HLO_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


@needs_sm90
@pytest.mark.parametrize("scheme", ROWWISE_OF_TRANSPOSE, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_quantize_transposed_runs_the_transposed_kernel_on_the_gpu(scheme, dtype):
    """quantize_transposed lowers to the transposed kernel (the PTX one: `mul.rn.ftz`,
    the saturating cvt, the tile stored transposed), with no transposed copy of x in
    high precision, and writes quantize(x.T)'s QArray and lowp's bytes: zero,
    subnormal, NaN, Inf and special columns, masked edges, one row, one column."""
    for shape in [(96, 1000), (1000, 96), (130, 70), (1, 37), (37, 1)]:
        x = jnp.asarray(column_cases(shape, dtype, seed=11))
        fn = jax.jit(lambda a: _quantize.quantize_transposed(a, scheme))
        text = fn.lower(x).compile().as_text()
        assert "lowp_float8_cast_transposed" in text, shape
        if min(shape) > 1:  # a transposed vector is a bitcast, a matrix a copy
            copy = f"{_HLO_DTYPES[dtype]}[{shape[1]},{shape[0]}]"
            assert copy not in text, f"{shape}: XLA transposes x ({copy}) after all"
        got = fn(x)
        _same_qarray(got, jax.jit(lambda a: lowp_jax.quantize(a.T, scheme))(x))
        _same_as_lowp(got, np.asarray(x), scheme)


@needs_sm90
def test_the_transposed_kernel_under_vmap_on_the_gpu():
    """vmap of quantize_transposed (each matrix its own column scales) runs the
    transposed kernel."""
    xs = jnp.asarray(np.stack([column_cases((64, 128), "bfloat16", seed=i) for i in range(3)]))
    scheme = lowp.AxisScaling(pow2=True)
    batched = jax.jit(jax.vmap(lambda a: _quantize.quantize_transposed(a, scheme)))
    assert "lowp_float8_cast_transposed" in batched.lower(xs).compile().as_text()
    got = batched(xs)
    for i in range(3):
        _same_qarray(
            jax.tree.map(lambda leaf, i=i: leaf[i], got), lowp_jax.quantize(xs[i].T, scheme)
        )


@needs_sm90
def test_float8_rowwise_training_takes_the_transposed_kernel_on_the_gpu():
    """float8_rowwise's training operands take the transposed kernel for w.T, dy.T and
    x.T, and are lowp's bytes."""
    rng = np.random.default_rng(8)
    x, w, g = (
        jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(jnp.bfloat16)
        for shape in ((256, 128), (192, 128), (256, 192))
    )
    operands = jax.jit(lambda x, w, g: lowp_jax.training_operands(x, w, g, "float8_rowwise"))
    assert "lowp_float8_cast_transposed" in operands.lower(x, w, g).compile().as_text()
    ops = operands(x, w, g)
    spec = lowp.Recipe.from_name("float8_rowwise")
    xn, wn, gn = (np.asarray(t.astype(jnp.float32)) for t in (x, w, g))
    _same_as_lowp(ops["dgrad"][1], wn, spec.dgrad.b)
    _same_as_lowp(ops["wgrad"][0], gn, spec.wgrad.a)
    _same_as_lowp(ops["wgrad"][1], xn, spec.wgrad.b)


@pytest.mark.skipif(
    not ON_SM90 or len(jax.devices()) < 2,
    reason="needs two NVIDIA GPUs of compute capability >= 9.0",
)
def test_a_sharded_quantize_transposed_casts_each_shard_on_its_gpu():
    """Rows of x over two GPUs: the column maxima are reduced across them, the
    transposed kernel casts each device's rows where they lie (no all-gather) into
    codes sharded along their columns, and the bytes are the unsharded ones."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    x = jnp.asarray(column_cases((256, 1000), "bfloat16", seed=13))
    xs = jax.device_put(x, NamedSharding(mesh, P("data", None)))
    scheme = lowp.AxisScaling()
    fn = jax.jit(lambda a: _quantize.quantize_transposed(a, scheme))
    text = fn.lower(xs).compile().as_text()
    assert "lowp_float8_cast_transposed" in text and "all-gather" not in text
    got = fn(xs)
    assert got.codes.sharding.is_equivalent_to(NamedSharding(mesh, P(None, "data")), 2)
    _same_as_lowp(got, np.asarray(x), scheme)
