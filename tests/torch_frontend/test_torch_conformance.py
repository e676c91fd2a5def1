"""lowp_torch against the NumPy reference `lowp`: what the cross-backend suite leaves to it.

The grid (every scheme x element format x rank 1-4 x spec §6 edge case x input dtype
x rounding, empty tensors, the cuBLAS layout, every output dtype) runs on torch_cpu
and torch_cuda_eager/compiled in tests/conformance/ through lowp_apps.conformance. Here:
torch.compile on the CPU (one graph per scheme kind, static shapes, each fed every
edge case), the encoder over a dense sweep of float32 patterns, explicit random bits,
non-contiguous inputs, conversions, and validation errors mirroring lowp's. On a
mismatch the message names the first differing element, its input bits and both
outputs.

(Named test_torch_conformance.py, not test_conformance.py: pytest's default import mode
imports test files by basename, and tests/jax_frontend/ has a test_conformance.py.)
"""

import dataclasses
import doctest
import importlib

import numpy as np
import pytest
import torch

import lowp
import lowp_torch
from lowp_apps.conformance import backends, cases, compare, run
from lowp_torch import _encode

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _differences(q, x32, ref) -> list[str]:
    """How lowp_torch's q (and its dequantization) differ from lowp's `ref`."""
    got = compare.Outputs(
        lowp_torch.to_lowp(q), {"float32": q.dequantize(torch.float32).cpu().numpy()}
    )
    return compare.differences(x32, ref, got)


# One compiled graph per scheme kind (and each MX mode and NVFP4 variant), covering
# every element format, all three input dtypes and both roundings across the set. On
# CUDA the conformance suite's torch_cuda_compiled backend runs its own plan.
COMPILED = [
    (lowp.TensorScaling("float8_e4m3fn"), "float32", "nearest"),
    (lowp.AxisScaling("float8_e5m2", axis=0, pow2=True), "float16", "nearest"),
    (lowp.BlockScaling("float6_e2m3fn", block=(3, 5)), "bfloat16", "nearest"),
    (lowp.MXScaling("float8_e4m3fn", block=8, mode="floor"), "float32", "nearest"),
    (lowp.MXScaling("float6_e3m2fn", block=8, mode="ceil"), "float32", "stochastic"),
    (lowp.MXScaling("float4_e2m1fn", block=8, mode="rceil"), "float32", "nearest"),
    (lowp.NVFP4Scaling(), "float32", "nearest"),
    (lowp.NVFP4Scaling(block=8, global_scale=False), "float32", "stochastic"),
]
CPU_COMPILED = backends.TorchBackend("torch_cpu_compiled", "cpu", compiled=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme, hp_dtype, rounding",
    COMPILED,
    ids=[f"{cases.scheme_id(s)}-{d}-{r}" for s, d, r in COMPILED],
)
def test_compiled_on_cpu_matches_lowp(scheme, hp_dtype, rounding):
    """torch.compile(fullgraph=True, dynamic=False) on the CPU: one graph, every edge case."""
    config = cases.Configuration(scheme, cases.SHAPES[3], hp_dtype, rounding)
    failures = []
    for edge, x in cases.inputs(config):
        problems = run.check(CPU_COMPILED, config, x)
        if problems:
            failures.append(f"[{edge}] " + "\n  ".join(problems))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", cases.ELEMENTS)
def test_encoder_and_decoder_match_lowp(device, fmt):
    """E_fmt over every float32 in range whose low 16 bits are an edge (ties included)."""
    f = lowp.ELEMENT_FORMATS[fmt]
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    patterns = (high[:, None] | low[None, :]).reshape(-1)
    values = patterns.view(np.float32)
    values = values[np.isfinite(values) & (np.abs(values) <= f.max)]
    got = _encode.encode(torch.from_numpy(values).to(device), f).cpu().numpy()
    want = lowp.encode(values, f)
    problem = compare.first_difference(f"encode {fmt}", got, want, values, None, "elements")
    assert problem is None, problem
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    decoded = _encode.decode(torch.from_numpy(codes).to(device), f).cpu().numpy()
    assert np.array_equal(decoded.view(np.uint32), lowp.decode(codes, f).view(np.uint32))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "seed, offset, shape", [(0, 0, (3,)), (7, 5, (4, 33)), (-1, 2**33 + 1, (2, 3, 4))]
)
def test_random_bits_match_lowp(device, seed, offset, shape):
    got = lowp_torch.random_bits(seed, shape, offset, device=device)
    assert got.dtype == torch.int64 and tuple(got.shape) == shape
    assert np.array_equal(got.cpu().numpy(), lowp.random_bits(seed, shape, offset).astype(np.int64))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits_dtype", [torch.uint32, torch.int64])
@pytest.mark.parametrize(
    "scheme",
    [lowp.MXScaling("float8_e4m3fn", block=8), lowp.NVFP4Scaling(block=8)],
    ids=cases.scheme_id,
)
def test_explicit_random_bits_match_lowp(device, bits_dtype, scheme):
    x32 = cases.make_input("random", (4, 32), scheme)
    rng = np.random.default_rng(3)
    r = rng.integers(0, 2**32, size=x32.shape, dtype=np.uint32)
    r.reshape(-1)[:6] = [0, 0xFF, 0x100, 0xFFFFFF00, 0xFFFFFFFF, 0x80000000]  # the extremes
    if bits_dtype == torch.uint32:
        r_torch = torch.from_numpy(r.view(np.int32)).view(torch.uint32).to(device)
    else:
        r_torch = torch.from_numpy(r.astype(np.int64)).to(device)
    q = lowp_torch.quantize(
        torch.from_numpy(x32).to(device), scheme, rounding="stochastic", random_bits=r_torch
    )
    ref = lowp.quantize(x32, scheme, rounding="stochastic", random_bits=r)
    problems = _differences(q, x32, ref)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", cases.configurations("thin"), ids=lambda c: c.id)
def test_from_lowp_and_back_keeps_every_byte(device, config):
    """The reference's QTensor (a poisoned group included), in the plain and, where it
    applies, the cuBLAS layout, goes into torch and back unchanged."""
    x = dict(cases.inputs(config))["nan"]
    ref = lowp.quantize(x, config.scheme)
    layouts = [ref] + (
        [ref.with_scale_layout("cublas_blocked")]
        if backends.blockable(config.scheme, config.shape)
        else []
    )
    for qt in layouts:
        back = lowp_torch.to_lowp(lowp_torch.from_lowp(qt, device=device))
        assert back.scale_layout == qt.scale_layout
        for field in ("codes", "scale", "global_scale"):
            got, want = getattr(back, field), getattr(qt, field)
            assert (got is None) == (want is None)
            if want is not None:
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (
                    field,
                    qt.scale_layout,
                )


def _raises_like_lowp(torch_call, lowp_call, error, same_message=True):
    with pytest.raises(error) as theirs:
        lowp_call()
    with pytest.raises(error) as ours:
        torch_call()
    if same_message:
        assert str(ours.value) == str(theirs.value)
    return str(ours.value)


X = np.zeros((4, 32), np.float32)
BAD_SCHEMES = [
    (lowp.AxisScaling(axis=2), (4, 32)),
    (lowp.MXScaling(block=24), (4, 32)),
    (lowp.MXScaling("float4_e2m1fn", block=2, axis=0), (4, 32)),
    (lowp.TensorScaling("float4_e2m1fn"), (4, 31)),
    (lowp.BlockScaling(), (32,)),
    (lowp.NVFP4Scaling(), (4, 24)),
    (lowp.NVFP4Scaling(axis=0), (16, 32)),
]


@pytest.mark.parametrize(
    "scheme, shape", BAD_SCHEMES, ids=[cases.scheme_id(s) + str(sh) for s, sh in BAD_SCHEMES]
)
def test_bad_shapes_raise_lowps_errors(scheme, shape):
    x = np.zeros(shape, np.float32)
    _raises_like_lowp(
        lambda: lowp_torch.quantize(torch.from_numpy(x), scheme),
        lambda: lowp.quantize(x, scheme),
        ValueError,
    )


BAD_ARGUMENTS = [
    ({"rounding": "up"}, ValueError),
    ({"seed": 1}, ValueError),
    ({"offset": 3}, ValueError),
    ({"rounding": "stochastic"}, ValueError),
    ({"rounding": "stochastic", "seed": 1, "random_bits": "BITS"}, ValueError),
    ({"rounding": "stochastic", "random_bits": "BITS", "offset": 1}, ValueError),
    ({"rounding": "stochastic", "seed": 1.5}, TypeError),
    ({"rounding": "stochastic", "seed": 1, "offset": "a"}, TypeError),
]


@pytest.mark.parametrize("kwargs, error", BAD_ARGUMENTS, ids=[str(k) for k, _ in BAD_ARGUMENTS])
def test_bad_rounding_arguments_raise_lowps_errors(kwargs, error):
    def call(quantize, x, bits):
        kw = {k: (bits if v == "BITS" else v) for k, v in kwargs.items()}
        return lambda: quantize(x, lowp.TensorScaling(), **kw)

    _raises_like_lowp(
        call(lowp_torch.quantize, torch.from_numpy(X), torch.zeros(X.shape, dtype=torch.int64)),
        call(lowp.quantize, X, np.zeros(X.shape, np.uint32)),
        error,
    )


def test_bad_inputs_name_the_problem():
    s = lowp.TensorScaling()
    with pytest.raises(TypeError, match="float64 input is refused"):
        lowp_torch.quantize(torch.zeros(4, dtype=torch.float64), s, name="w")
    with pytest.raises(TypeError, match="w: input dtype torch.int32 is not float32"):
        lowp_torch.quantize(torch.zeros(4, dtype=torch.int32), s, name="w")
    with pytest.raises(TypeError, match="takes a torch.Tensor, got ndarray"):
        lowp_torch.quantize(X, s)
    with pytest.raises(TypeError, match="expected a lowp scheme"):
        lowp_torch.quantize(torch.zeros(4), "float8")
    x = torch.zeros(4, 32)
    with pytest.raises(TypeError, match="random_bits must be a uint32 torch tensor"):
        lowp_torch.quantize(
            x, s, rounding="stochastic", random_bits=torch.zeros(4, 32, dtype=torch.int32)
        )
    with pytest.raises(ValueError, match=r"random_bits has shape \(4, 31\), the input \(4, 32\)"):
        lowp_torch.quantize(
            x, s, rounding="stochastic", random_bits=torch.zeros(4, 31, dtype=torch.int64)
        )
    q = lowp_torch.quantize(x, s)
    with pytest.raises(TypeError, match="takes a lowp_torch.QuantizedTensor"):
        lowp_torch.dequantize(lowp.quantize(X, s))
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        lowp_torch.dequantize(q, torch.float64)
    with pytest.raises(ValueError, match="cublas_blocked layout is for MX and NVFP4"):
        q.with_scale_layout("cublas_blocked")
    with pytest.raises(ValueError, match="unknown scale layout"):
        q.with_scale_layout("swizzled")


def test_check_finite_names_the_tensor_as_lowp_does():
    x = cases.make_input("random", (4, 32), lowp.MXScaling())
    x[2, 5], x[3, 0] = np.inf, np.nan
    message = _raises_like_lowp(
        lambda: lowp_torch.quantize(
            torch.from_numpy(x), lowp.MXScaling(), check_finite=True, name="layer1.weight"
        ),
        lambda: lowp.quantize(x, lowp.MXScaling(), check_finite=True, name="layer1.weight"),
        FloatingPointError,
    )
    assert message.startswith("layer1.weight: 2 non-finite element(s), the first at index (2, 5)")


@pytest.mark.slow
def test_check_finite_raises_under_torch_compile_too():
    """The check is a host sync, so compile breaks the graph there; the error is the same."""
    quantize = torch.compile(
        lambda t: lowp_torch.quantize(t, lowp.TensorScaling(), check_finite=True, name="x").codes
    )
    bad = torch.ones(4, 32)
    bad[1, 2] = float("nan")
    with pytest.raises(
        FloatingPointError, match=r"x: 1 non-finite element\(s\), the first at index \(1, 2\)"
    ):
        quantize(bad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "scheme",
    [lowp.AxisScaling(axis=0), lowp.MXScaling(block=8, mode="ceil"), lowp.NVFP4Scaling(block=8)],
    ids=cases.scheme_id,
)
def test_non_contiguous_input_is_quantized_as_its_values(device, scheme):
    """A transposed view quantizes like its contiguous copy; seed bits follow the logical index."""
    x32 = cases.make_input("random", (32, 8), scheme)
    view = torch.from_numpy(x32).to(device).t()
    assert not view.is_contiguous()
    kwargs = {"rounding": "stochastic", "seed": 1237, "offset": 231}
    q = lowp_torch.quantize(view, scheme, **kwargs)
    ref = lowp.quantize(np.ascontiguousarray(x32.T), scheme, **kwargs)
    problems = _differences(q, np.ascontiguousarray(x32.T), ref)
    assert not problems, "\n".join(problems)


def test_quantized_tensor_refuses_inconsistent_fields():
    q = lowp_torch.quantize(torch.ones(4, 32), lowp.NVFP4Scaling())

    with pytest.raises(TypeError, match="codes must be torch.float4_e2m1fn_x2"):
        q.replace(codes=q.codes.view(torch.uint8))
    with pytest.raises(ValueError, match="scale must have shape"):
        q.replace(scale=q.scale[:1])
    with pytest.raises(ValueError, match="global_scale must be None"):
        q.replace(scheme=lowp.NVFP4Scaling(global_scale=False))
    with pytest.raises(ValueError, match="hp_dtype must be one of"):
        q.replace(hp_dtype=torch.float64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.codes = q.codes


@pytest.mark.parametrize("device", DEVICES)
def test_quantize_does_not_mutate_its_input(device):
    x = torch.from_numpy(cases.make_input("nan", (4, 32), lowp.NVFP4Scaling())).to(device)
    before = x.clone()
    for scheme in (
        lowp.NVFP4Scaling(),
        lowp.MXScaling(mode="rceil"),
        lowp.BlockScaling(block=(2, 8)),
    ):
        lowp_torch.quantize(x, scheme, rounding="stochastic", seed=1)
    assert torch.equal(x.view(torch.int32), before.view(torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_storage_dtypes_are_torchs_native_ones(device):
    x = torch.ones(2, 32, device=device)
    expect = {
        lowp.TensorScaling("float8_e4m3fn"): (torch.float8_e4m3fn, torch.float32),
        lowp.AxisScaling("float8_e5m2"): (torch.float8_e5m2, torch.float32),
        lowp.BlockScaling("float6_e3m2fn"): (torch.uint8, torch.float32),
        lowp.MXScaling("float4_e2m1fn"): (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu),
        lowp.NVFP4Scaling(): (torch.float4_e2m1fn_x2, torch.float8_e4m3fn),
    }
    for scheme, (code_dtype, scale_dtype) in expect.items():
        q = lowp_torch.quantize(x, scheme)
        assert (q.codes.dtype, q.scale.dtype, q.codes.device.type) == (
            code_dtype,
            scale_dtype,
            x.device.type,
        )
    q = lowp_torch.quantize(x.to(torch.bfloat16), lowp.NVFP4Scaling())
    assert q.global_scale.dtype == torch.float32 and q.global_scale.shape == ()
    assert q.hp_dtype == torch.bfloat16 and q.dequantize().dtype == torch.bfloat16


@pytest.mark.parametrize(
    "module",
    ["_bits", "_convert", "_encode", "_layouts", "_qtensor", "_quantize", "_rounding", "_storage"],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(
        importlib.import_module(f"lowp_torch.{module}"), optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0
