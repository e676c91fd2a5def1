"""lowp.quantize a slab at a time: the same bytes at every slab size, the fast element
cast equal to the integer encoder, and signalling NaNs poisoning their group."""

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp import _formats, _groups, _rounding

SCHEMES = [
    lowp.TensorScaling(),
    lowp.TensorScaling("float8_e5m2", pow2=True),
    lowp.AxisScaling(axis=-1),
    lowp.AxisScaling(axis=0),
    lowp.AxisScaling("float6_e3m2fn", axis=1),
    lowp.BlockScaling(block=(1, 16)),
    lowp.BlockScaling(block=(4, 8)),
    lowp.BlockScaling("float4_e2m1fn", block=(3, 5)),  # partial edge tiles both ways
    lowp.GroupScaling(block=8),
    lowp.GroupScaling(block=4, axis=0),
    lowp.MXScaling(block=8),
    lowp.MXScaling("float8_e5m2", block=4, mode="ceil", axis=0),
    lowp.MXScaling("float6_e2m3fn", block=8, mode="rceil"),
    lowp.MXScaling("float6_e3m2fn", block=4),
    lowp.MXScaling("float4_e2m1fn", block=8),
    lowp.NVFP4Scaling(block=8),
    lowp.NVFP4Scaling(block=4, global_scale=False),
]
SHAPES = [(12, 16), (2, 12, 16), (4, 3, 16)]  # (4, 3, 16): rows of 3 do not merge in 4-row tiles
HP_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


def _admits(scheme, shape) -> bool:
    try:
        scheme.check_shape(shape)
    except ValueError:
        return False
    return True


def _input(shape, hp_dtype, seed):
    """Normal values with a spread of scales, zeros, float32 subnormals and, per seed,
    a NaN and an Inf in some group."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.float32(2.0) ** rng.integers(-20, 12, size=shape[:-1] + (1,)).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 5)] = 0
    flat[rng.integers(0, flat.size, 3)] = np.float32(3e-39) * rng.choice([-1, 1], 3)
    if seed % 3 == 1:
        flat[rng.integers(0, flat.size)] = np.nan
    if seed % 3 == 2:
        flat[rng.integers(0, flat.size)] = -np.inf
    return x.astype(hp_dtype)


def _bytes(q: lowp.QTensor):
    global_scale = None if q.global_scale is None else q.global_scale.tobytes()
    return (q.codes.shape, q.codes.tobytes(), q.scale.shape, q.scale.tobytes(), global_scale)


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [(scheme, shape) for scheme in SCHEMES for shape in SHAPES if _admits(scheme, shape)],
    ids=str,
)
@pytest.mark.parametrize("rounding", ["nearest", "seed", "bits"])
def test_every_slab_size_gives_the_same_bytes(scheme, shape, rounding):
    for seed, hp_dtype in enumerate(HP_DTYPES * 2):
        x = _input(shape, hp_dtype, seed)
        kwargs: dict = {}
        if rounding == "seed":
            kwargs = {"rounding": "stochastic", "seed": seed, "offset": 2**32 - 50}
        elif rounding == "bits":
            bits = np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint32)
            kwargs = {"rounding": "stochastic", "random_bits": bits}
        whole = _bytes(lowp.quantize(x, scheme, **kwargs, chunk_elements=1 << 30))
        for chunk in (1, 5, 16, 40):
            assert _bytes(lowp.quantize(x, scheme, **kwargs, chunk_elements=chunk)) == whole


@pytest.mark.parametrize("scheme", SCHEMES[:4] + SCHEMES[8:11], ids=lambda s: s.spec)
def test_a_strided_input_gives_the_bytes_of_its_copy(scheme):
    """A transposed view cannot merge its leading dims into a view: slabs cut it as is."""
    x = _input((16, 2, 12), np.float32, 4).transpose(2, 1, 0)
    copy = np.ascontiguousarray(x)
    for chunk in (1, 16, 1 << 30):
        got = lowp.quantize(x, scheme, rounding="stochastic", seed=3, chunk_elements=chunk)
        assert _bytes(got) == _bytes(lowp.quantize(copy, scheme, rounding="stochastic", seed=3))
    assert np.array_equal(x, copy, equal_nan=True)  # the input is never written


def test_slabs_cut_whole_groups_and_random_bits_are_sliced_by_index():
    rows = lowp.BlockScaling(block=(4, 8))
    assert _groups.slabs((10, 8), rows, 8) == [(0, 4), (4, 8), (8, 10)]
    assert _groups.slabs((10, 8), lowp.TensorScaling(), 20) == [
        (0, 2),
        (2, 4),
        (4, 6),
        (6, 8),
        (8, 10),
    ]
    assert _groups.slabs((0, 8), rows, 8) == [(0, 0)]
    whole = lowp.random_bits(7, (5, 6), offset=2**32 - 3)
    part = _rounding.random_bits_from(7, 2**32 - 3 + 12, 18)
    assert np.array_equal(part, whole.reshape(-1)[12:])


def test_the_scalar_and_empty_inputs_keep_their_shapes():
    q = lowp.quantize(np.float32(3.0), lowp.TensorScaling(), chunk_elements=1)
    assert q.codes.shape == () and q.codes.tolist() == 126 and lowp.dequantize(q) == 3
    q = lowp.quantize(np.zeros((0, 8), np.float32), lowp.AxisScaling(axis=0), chunk_elements=1)
    assert q.codes.shape == (0, 8) and q.scale.shape == (1, 8)
    assert np.array_equal(q.scale, np.full((1, 8), np.float32(1e-12) / 448, np.float32))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_chunk_size_is_named(bad):
    with pytest.raises((TypeError, ValueError), match="chunk_elements"):
        lowp.quantize(np.ones(4, np.float32), lowp.TensorScaling(), chunk_elements=bad)


def _rounding_cases(fmt: _formats.Format) -> np.ndarray:
    """At every float32 exponent up to fmt.max's: for every count of dropped mantissa
    bits (the format's own, and more below its smallest normal), the kept bits 0, 1, 2,
    3 and the two largest (a carry into the exponent) with the dropped bits 0, 1,
    half - 1, half, half + 1 and all ones; 256 random mantissas; both signs; and float32
    subnormals and zero."""
    rng = np.random.default_rng(0)
    patterns = []
    top = int(np.float32(fmt.max).view(np.uint32) >> 23)
    for exponent in range(1, top + 1):
        for drop in range(1, 24):
            width = (1 << (23 - drop)) - 1
            kept = np.array([0, 1, 2, 3, width - 1, width], np.int64).clip(0, width) << drop
            half = 1 << (drop - 1)
            rest = np.array([0, 1, half - 1, half, half + 1, (1 << drop) - 1], np.int64)
            mantissas = (kept[:, None] | rest[None, :]).ravel()
            patterns.append((exponent << 23) | mantissas)
        patterns.append((exponent << 23) | rng.integers(0, 1 << 23, 256))
    patterns.append(np.array([0, 1, 2, 0x400000, 0x7FFFFF]))
    mags = np.concatenate(patterns).astype(np.uint32).view(np.float32)
    mags = mags[mags <= np.float32(fmt.max)]
    return np.concatenate([mags, -mags])


@pytest.mark.parametrize("fmt", list(_formats.ELEMENT_FORMATS.values()), ids=lambda f: f.name)
def test_the_element_step_rounds_as_the_integer_encoder_and_the_cast(fmt):
    v = _rounding_cases(fmt)
    got = _rounding.nearest_codes(v, fmt)
    assert np.array_equal(got, _formats.encode_in_range(v, fmt))
    assert np.array_equal(got, v.astype(getattr(ml_dtypes, fmt.name)).view(np.uint8))


def _quiet_and_signalling(hp_dtype):
    """A quiet and a signalling NaN of `hp_dtype`, each as a one-element array."""
    uint, quiet, signalling = {
        "float32": (np.uint32, 0x7FC00000, 0x7F800001),
        "bfloat16": (np.uint16, 0x7FC0, 0x7F81),
        "float16": (np.uint16, 0x7E00, 0x7C01),
    }[hp_dtype]
    dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
    return [np.array([b], uint).view(dtype[hp_dtype]) for b in (quiet, signalling)]


@pytest.mark.parametrize("hp_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    "scheme",
    [
        lowp.MXScaling(),
        lowp.MXScaling("float4_e2m1fn", mode="rceil"),
        lowp.NVFP4Scaling(),
        lowp.NVFP4Scaling(global_scale=False),
        lowp.GroupScaling(),
        lowp.TensorScaling(),
    ],
    ids=lambda s: s.spec,
)
def test_a_signalling_nan_poisons_its_group_as_a_quiet_one(scheme, hp_dtype):
    """Under the suite's warnings-as-errors, a warning from the arithmetic would fail."""
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    x = x.astype(
        {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[hp_dtype]
    )
    got = []
    for nan in _quiet_and_signalling(hp_dtype):
        y = x.copy()
        y[1, 5] = nan[0]
        got.append(lowp.quantize(y, scheme))
    quiet, signalling = got
    assert _bytes(signalling) == _bytes(quiet)
    # [1, 5] is in row 1's first group of 16 or 32; a global or tensor scale poisons all.
    whole = isinstance(scheme, lowp.TensorScaling) or getattr(scheme, "global_scale", False)
    nan = np.isnan(lowp.dequantize(signalling, "float32"))
    assert nan[1, :16].all() and nan[0].all() == whole and nan[0].any() == whole


FP4_SCHEMES_1D = [
    lowp.NVFP4Scaling(),
    lowp.NVFP4Scaling(block=8, global_scale=False),
    lowp.MXScaling("float4_e2m1fn"),
    lowp.GroupScaling("float4_e2m1fn", block=5),  # odd groups: slabs must still cut whole bytes
    lowp.TensorScaling("float4_e2m1fn"),
]


@pytest.mark.parametrize("scheme", FP4_SCHEMES_1D, ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "seed"])
def test_a_1d_fp4_input_gives_the_same_bytes_at_every_slab_size(scheme, rounding):
    """Packed codes hold two elements a byte along the one axis the slabs cut."""
    x = _input((320,), np.float32, 0)
    kwargs: dict = {"rounding": "stochastic", "seed": 7} if rounding == "seed" else {}
    whole = _bytes(lowp.quantize(x, scheme, **kwargs, chunk_elements=1 << 30))
    for chunk in (1, 5, 16, 32, 33, 47, 100):
        assert _bytes(lowp.quantize(x, scheme, **kwargs, chunk_elements=chunk)) == whole


def test_a_1d_fp4_input_larger_than_the_default_chunk_quantizes():
    x = np.ones(1 << 21, np.float32)
    for scheme in (lowp.NVFP4Scaling(), lowp.MXScaling("float4_e2m1fn")):
        q = lowp.quantize(x, scheme)
        assert q.codes.shape == (1 << 20,)
        assert _bytes(q) == _bytes(lowp.quantize(x, scheme, chunk_elements=1 << 30))


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.spec)
def test_dequantize_in_slabs_gives_the_same_values(scheme):
    """lowp.dequantize a slab at a time (issue 23 item 5): every slab size gives the
    bytes of one slab, for every out_dtype, NaN-poisoned groups included."""
    for seed, shape in enumerate(SHAPES + [(96,), ()]):
        if not _admits(scheme, shape):
            continue
        q = lowp.quantize(_input(shape, np.float32, seed) if shape else np.float32(1.5), scheme)
        for out_dtype in ("float32", "bfloat16", "float16"):
            whole = lowp.dequantize(q, out_dtype, chunk_elements=10**9)
            assert whole.shape == shape
            for chunk_elements in (1, 24):
                got = lowp.dequantize(q, out_dtype, chunk_elements=chunk_elements)
                assert got.shape == shape and got.tobytes() == whole.tobytes(), (shape, out_dtype)


def test_an_empty_shape_is_one_slab_however_many_rows_it_claims():
    from lowp import extend

    plan = extend.slab_plan((2**40, 0), lowp.TensorScaling(), 8)
    assert plan.slabs == [(0, 2**40)]
