"""lowp_torch.quantize on the CPU, a slab at a time (issue 23 item 5): the bytes of the
whole-tensor ops (the path CUDA and torch.compile take) at every slab size, for every
scheme family, both roundings and every high-precision dtype, and those of the NumPy
reference."""

import numpy as np
import pytest
import torch

import lowp
import lowp_torch
from lowp_torch import _quantize, _storage

SCHEMES = [
    lowp.TensorScaling(),
    lowp.TensorScaling("float8_e5m2", pow2=True),
    lowp.AxisScaling(axis=-1),
    lowp.AxisScaling(axis=0),
    lowp.AxisScaling("float6_e3m2fn", axis=1),
    lowp.BlockScaling(block=(4, 8)),
    lowp.BlockScaling("float4_e2m1fn", block=(3, 5)),  # partial edge tiles both ways
    lowp.GroupScaling(block=8),
    lowp.GroupScaling(block=4, axis=0),
    lowp.MXScaling(block=8),
    lowp.MXScaling("float8_e5m2", block=4, mode="ceil", axis=0),
    lowp.MXScaling("float6_e2m3fn", block=8, mode="rceil"),
    lowp.MXScaling("float4_e2m1fn", block=8),
    lowp.NVFP4Scaling(block=8),
    lowp.NVFP4Scaling(block=4, global_scale=False),
]
SHAPES = [(12, 16), (2, 12, 16), (4, 3, 16), (96,)]
HP_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _admits(scheme, shape) -> bool:
    try:
        scheme.check_shape(shape)
    except ValueError:
        return False
    return True


def _input(shape, hp_dtype, seed) -> torch.Tensor:
    """Normal values with a spread of scales, zeros, float32 subnormals and, per seed,
    a NaN or an Inf in some group."""
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
    return torch.from_numpy(x).to(hp_dtype)


def _bytes(q) -> tuple:
    """Everything stored, as bytes: codes, scale, global scale, and their shapes."""

    def raw(t):
        return (
            None
            if t is None
            else (tuple(t.shape), _storage.as_bytes(t.reshape(-1)).numpy().tobytes())
        )

    def as_u8(t):
        return t if t is None or t.element_size() != 1 else _storage.as_bytes(t)

    global_scale = None if q.global_scale is None else q.global_scale.numpy().tobytes()
    scale = q.scale if q.scale.dtype == torch.float32 else as_u8(q.scale)
    return (
        tuple(q.codes.shape),
        as_u8(q.codes).contiguous().numpy().tobytes(),
        tuple(scale.shape),
        scale.contiguous().numpy().tobytes(),
        global_scale,
    )


def _whole(monkeypatch, *args, **kwargs):
    """quantize on the whole-tensor ops, as on CUDA or under torch.compile."""
    with monkeypatch.context() as patch:
        patch.setattr(_quantize, "_in_slabs", lambda t: False)
        return lowp_torch.quantize(*args, **kwargs)


def _reference(x: torch.Tensor, scheme, **kwargs):
    import ml_dtypes

    numpy_dtype = {torch.float32: np.float32, torch.float16: np.float16}
    if x.dtype == torch.bfloat16:
        array = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        array = x.numpy().astype(numpy_dtype[x.dtype])
    if isinstance(kwargs.get("random_bits"), torch.Tensor):
        kwargs["random_bits"] = kwargs["random_bits"].numpy().astype(np.uint32)
    return lowp.quantize(array, scheme, **kwargs)


def _reference_bytes(q: lowp.QTensor) -> tuple:
    global_scale = None if q.global_scale is None else q.global_scale.tobytes()
    return (q.codes.shape, q.codes.tobytes(), q.scale.shape, q.scale.tobytes(), global_scale)


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.spec)
# the given-bits cases (a third of the matrix) run in the slow tier, for the fast tier's time
@pytest.mark.parametrize(
    "rounding", ["nearest", "seed", pytest.param("bits", marks=pytest.mark.slow)]
)
def test_slabs_give_the_whole_tensors_bytes(scheme, rounding, monkeypatch):
    """Every slab size (one row of groups, a few, all) gives the bytes of the whole-tensor
    ops and of the reference; stochastic bits follow each element's global index."""
    for seed, shape in enumerate(SHAPES):
        if not _admits(scheme, shape):
            continue
        for hp_dtype in (torch.float32, HP_DTYPES[1 + seed % 2]):
            x = _input(shape, hp_dtype, seed)
            kwargs: dict = {}
            if rounding == "seed":
                kwargs = {"rounding": "stochastic", "seed": 7, "offset": 2**32 - 40}
            elif rounding == "bits":
                bits = np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint32)
                kwargs = {
                    "rounding": "stochastic",
                    "random_bits": torch.from_numpy(bits if seed % 2 else bits.astype(np.int64)),
                }
            whole = _bytes(_whole(monkeypatch, x, scheme, **kwargs))
            reference = _reference_bytes(_reference(x, scheme, **kwargs))
            assert whole[1] == reference[1] and whole[3] == reference[3], (shape, hp_dtype)
            for chunk_elements in (1, 40, 10**6):
                got = _bytes(
                    lowp_torch.quantize(x, scheme, chunk_elements=chunk_elements, **kwargs)
                )
                assert got == whole, (shape, hp_dtype, chunk_elements)


@pytest.mark.parametrize(
    "scheme",
    [
        lowp.TensorScaling(),
        lowp.AxisScaling(axis=-1),
        lowp.MXScaling(block=8),
        lowp.MXScaling("float4_e2m1fn", block=8, mode="ceil"),
        lowp.NVFP4Scaling(block=8),
        lowp.NVFP4Scaling(block=8, global_scale=False),
    ],
    ids=lambda s: s.spec,
)
def test_stochastic_slabs_lift_their_multipliers_only_where_they_stay_finite(scheme, monkeypatch):
    """Stochastic rounding on the host folds 2**K into the multipliers where every one
    stays finite: rows of groups at 2**-110 (MX bytes below K), all-zero rows (NVFP4's
    byte 0, 1/p = FLT_MAX) and rows of 2**-126 neighbours, one or several to a slab,
    give the whole-tensor ops' bytes and the reference's."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    x[1] *= np.float32(2.0**-110)
    x[3] = 0
    x[5] *= np.float32(2.0**-100)
    x[6] = np.float32(2.0**-126) * rng.choice([-1.0, 1.0], 16).astype(np.float32)
    t = torch.from_numpy(x)
    kwargs = {"rounding": "stochastic", "seed": 3}
    whole = _bytes(_whole(monkeypatch, t, scheme, **kwargs))
    reference = _reference_bytes(_reference(t, scheme, **kwargs))
    assert (whole[1], whole[3], whole[4]) == (reference[1], reference[3], reference[4])
    for chunk_elements in (16, 48, 10**6):
        got = _bytes(lowp_torch.quantize(t, scheme, chunk_elements=chunk_elements, **kwargs))
        assert got == whole, chunk_elements


@pytest.mark.parametrize("scheme", [lowp.AxisScaling(axis=0), lowp.MXScaling(block=8)], ids=str)
def test_a_strided_input_gives_the_bytes_of_its_copy(scheme):
    """A transposed (non-contiguous) input is cut as it lies, its leading dims unmerged."""
    x = _input((16, 2, 24), torch.float32, 4).permute(1, 0, 2)  # (2, 16, 24), strided
    assert not x.is_contiguous()
    for chunk_elements in (1, 50, 10**6):
        got = lowp_torch.quantize(x, scheme, chunk_elements=chunk_elements)
        assert _bytes(got) == _bytes(lowp_torch.quantize(x.contiguous(), scheme))


def test_check_finite_names_the_first_non_finite_element_across_slabs():
    x = torch.ones(8, 16)
    x[5, 3], x[6, 0] = float("nan"), float("-inf")
    for chunk_elements in (16, 10**6):
        with pytest.raises(FloatingPointError, match=r"w: 2 non-finite.*index \(5, 3\)"):
            lowp_torch.quantize(
                x,
                lowp.MXScaling(block=8),
                check_finite=True,
                name="w",
                chunk_elements=chunk_elements,
            )


@pytest.mark.parametrize("bad, error", [(0, ValueError), (2.5, TypeError), (True, TypeError)])
def test_a_bad_chunk_size_is_refused_by_name(bad, error):
    with pytest.raises(error, match="w: chunk_elements"):
        lowp_torch.quantize(torch.ones(4, 32), lowp.MXScaling(), chunk_elements=bad, name="w")


def test_the_input_is_not_modified():
    """Slabs of a float32 input are views of it: nothing may be written through them."""
    x = _input((12, 16), torch.float32, 1)
    before = x.clone()
    for scheme in SCHEMES:
        if _admits(scheme, tuple(x.shape)):
            lowp_torch.quantize(x, scheme, chunk_elements=16)
    assert torch.equal(x.view(torch.int32), before.view(torch.int32))


def test_make_fx_traces_the_whole_tensor_ops_and_keeps_the_poison_rule():
    """make_fx sees plain CPU tensors; the slab path's data-dependent skips would be
    read off the traced input (or refused as a data-dependent value). Traced whole, the
    graph run on an input with a NaN poisons its group as eager does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    scheme = lowp.MXScaling(mode="rceil")

    def codes_and_scales(x):
        q = lowp_torch.quantize(x, scheme)
        return q.codes.view(torch.uint8), q.scale.view(torch.uint8)

    graph = make_fx(codes_and_scales, tracing_mode="real")(torch.randn(4, 64))
    y = torch.randn(4, 64)
    y[1, 3] = float("nan")
    for got, want in zip(graph(y), codes_and_scales(y), strict=True):
        assert torch.equal(got, want)


def test_given_random_bits_are_not_modified():
    """The host element step works in the random bits' buffer: a copy of the given ones."""
    x = _input((12, 16), torch.float32, 0)
    bits = torch.from_numpy(np.random.default_rng(3).integers(0, 2**32, (12, 16), np.uint32))
    for given in (bits, bits.view(torch.int32).to(torch.int64) & 0xFFFFFFFF):
        before = given.clone()
        q = lowp_torch.quantize(
            x, lowp.MXScaling(block=8), rounding="stochastic", random_bits=given
        )
        assert torch.equal(given, before)
        want = lowp.quantize(
            x.numpy(), lowp.MXScaling(block=8), rounding="stochastic", random_bits=bits.numpy()
        )
        assert _storage.as_bytes(q.codes).numpy().tobytes() == want.codes.tobytes()


def _element_cases(fmt) -> np.ndarray:
    """float32 values for the element steps: every exponent up to fmt.max's with kept
    mantissas, ties and the patterns around them (tests/test_chunked.py), random ones,
    tiny ones on the subnormal grid, float32 subnormals and zeros, values beyond fmt.max
    and infinities (the host steps clamp), both signs."""
    from tests.test_chunked import _rounding_cases

    rng = np.random.default_rng(1)
    extra = [
        rng.standard_normal(20000) * fmt.max / 3,
        rng.standard_normal(20000) * fmt.min_normal,
        [0.0, 1e-40, fmt.max, fmt.max * 1.01, 3e38, np.inf],
    ]
    more = np.concatenate([np.asarray(e, np.float32) for e in extra])
    return np.concatenate([_rounding_cases(fmt), more, -more])


@pytest.mark.parametrize("fmt", list(lowp.ELEMENT_FORMATS.values()), ids=lambda f: f.name)
def test_the_host_element_steps_give_the_references_codes(fmt):
    """`nearest_codes_on_host` and `float8_codes_on_host` are E_fmt (the reference's
    integer encoder) and `stochastic_codes_on_host` the reference's stochastic codes, on |v| and the sign,
    with random bits at the extremes, at the top bit, and drawn."""
    from lowp import _formats, _rounding
    from lowp_torch import _encode, _scratch
    from lowp_torch import _rounding as torch_rounding

    v = _element_cases(fmt)
    clamped = np.clip(v, -np.float32(fmt.max), np.float32(fmt.max))
    sign_bits = torch.from_numpy(v).view(torch.int32)
    scratch = _scratch.Scratch()
    out = torch.empty(v.shape, dtype=torch.uint8)
    _encode.nearest_codes_on_host(torch.from_numpy(np.abs(v)), sign_bits, fmt, scratch, out)
    assert np.array_equal(out.numpy(), _formats.encode_in_range(clamped, fmt))
    if _encode.cast_on_host(fmt):  # float8 by torch's cast, float6 through its carrier
        out.zero_()
        _encode.float8_codes_on_host(torch.from_numpy(clamped.copy()), fmt, scratch, out)
        assert np.array_equal(out.numpy(), _formats.encode_in_range(clamped, fmt))
    rng = np.random.default_rng(2)
    for r in (0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, None):
        bits = (
            rng.integers(0, 2**32, v.shape, np.uint32)
            if r is None
            else np.full(v.shape, r, np.uint32)
        )
        want = _rounding.stochastic_codes(clamped, fmt, bits, _rounding.Scratch())
        # |v| itself, and |v| * 2**K as a caller's scaled multipliers make it (float32
        # subnormals and overflows included)
        grid = np.float32(2.0 ** torch_rounding.grid_exponent(fmt))
        with np.errstate(over="ignore"):
            scaled_magnitude = np.abs(v) * grid
        for scaled, magnitude in ((False, np.abs(v)), (True, scaled_magnitude)):
            random = torch.from_numpy(bits.copy()).view(torch.int32)
            torch_rounding.stochastic_codes_on_host(
                torch.from_numpy(magnitude), sign_bits, fmt, random, scratch, out, scaled
            )
            assert np.array_equal(out.numpy(), want), (r, scaled)


def test_the_host_random_bits_are_lowps():
    from lowp_torch import _rounding, _scratch

    scratch = _scratch.Scratch()
    for seed, first, count in [
        (0, 0, 100),
        (7, 2**32 - 3, 1000),
        (-1, -5, 4099),
        (2**40 + 9, 17, 64),
    ]:
        got = _rounding.random_bits_on_host(seed, first, count, scratch)
        want = lowp.random_bits(seed, (count,), offset=first)
        assert np.array_equal(got.numpy().view(np.uint32), want), (seed, first)
