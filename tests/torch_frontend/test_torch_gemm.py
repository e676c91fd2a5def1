"""scaled_matmul: every path against the exact product of its dequantized operands (spec §7).

The operands are bit-exact (conformance suite); a GEMM is checked against the float64
product of the dequantized operands: SQNR >= 40 dB on every path, and without fast
accumulation `|y - y_exact| <= ulp_out(y_exact) + K * 2^-23 * (sum_k |a_ik b_kj| + |bias_j|)`.
The emulated path runs everywhere; the kernel paths run where CUDA offers them and
skip, naming the reason, elsewhere.
"""

import logging

import pytest
import torch

import lowp
import lowp_torch
from lowp_torch import _gemm

E4M3, E5M2, E2M1 = "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"
CUDA = torch.cuda.is_available()
MANTISSA_BITS = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}

# (activation scheme, weight scheme) of every preset, and other format pairs.
PAIRS = {
    name: (cfg.activation or cfg.weight, cfg.weight)
    for name in lowp.InferenceConfig.names()
    for cfg in [lowp.InferenceConfig.from_name(name)]
}
PAIRS.update(
    {
        "tensor_e5m2_x_e4m3": (lowp.TensorScaling(E5M2), lowp.TensorScaling(E4M3)),
        "rowwise_pow2": (lowp.AxisScaling(E4M3, pow2=True), lowp.AxisScaling(E4M3, pow2=True)),
        # float8_rowwise_gw_hp's dgrad: dy rowwise, w tensorwise.
        "rowwise_x_tensor": (
            lowp.AxisScaling(E4M3, pow2=True),
            lowp.TensorScaling(E4M3, pow2=True),
        ),
        "block_1x128_x_1x128": (
            lowp.BlockScaling(block=(1, 128)),
            lowp.BlockScaling(block=(1, 128)),
        ),
        "mx_e5m2": (lowp.MXScaling(E5M2), lowp.MXScaling(E4M3)),
        "mx_fp6": (lowp.MXScaling("float6_e3m2fn"), lowp.MXScaling("float6_e2m3fn")),
        "nvfp4_no_global": (lowp.NVFP4Scaling(global_scale=False),) * 2,
        "mixed_tensor_x_mx": (lowp.TensorScaling(E4M3), lowp.MXScaling(E2M1)),
    }
)


def _operands(pair, m=48, k=256, n=64, batch=None, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    x = torch.randn(lead + (m, k), generator=gen)
    w = torch.randn(lead + (n, k), generator=gen) * 0.05
    x[..., 3, :] = 0  # an all-zero row: its output must be the bias, not NaN
    bias = torch.randn(n, generator=gen)
    a = lowp_torch.quantize(x.to(device), pair[0])
    b = lowp_torch.quantize(w.to(device), pair[1])
    return a, b, bias.to(device)


def exact_product(a, b, bias):
    a64 = a.dequantize(torch.float32).double()
    b64 = b.dequantize(torch.float32).double()
    y = a64 @ b64.transpose(-1, -2)
    mass = a64.abs() @ b64.abs().transpose(-1, -2)
    if bias is not None:
        y, mass = y + bias.double(), mass + bias.double().abs()
    return y, mass


def sqnr_db(y, reference) -> float:
    error = (y.double() - reference).norm()
    return float("inf") if error == 0 else float(20 * torch.log10(reference.norm() / error))


def check_bound(y, y_exact, mass, k):
    """|y - y_exact| <= ulp_out(y_exact) + K * 2^-23 * mass, elementwise."""
    _, exponent = torch.frexp(y_exact)
    ulp = torch.ldexp(torch.ones_like(y_exact), exponent - 1 - MANTISSA_BITS[y.dtype])
    bound = ulp + k * 2.0**-23 * mass
    excess = (y.double() - y_exact).abs() - bound
    assert excess.max() <= 0, f"bound exceeded by {excess.max():.3g} at {int(excess.argmax())}"


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("batch", [None, 2], ids=["2d", "batched"])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_emulated_matches_exact_product(pair, batch, out_dtype):
    a, b, bias = _operands(PAIRS[pair], batch=batch)
    y = lowp_torch.scaled_matmul(a, b, out_dtype=out_dtype, bias=bias, kernel="emulated")
    assert y.dtype == out_dtype and y.shape == a.shape[:-1] + (b.shape[-2],)
    y_exact, mass = exact_product(a, b, bias)
    assert sqnr_db(y, y_exact) >= 40
    check_bound(y, y_exact, mass, a.shape[-1])
    assert torch.equal(y[..., 3, :], bias.to(out_dtype).expand_as(y[..., 3, :]))  # zero row


def test_auto_on_cpu_emulates_and_says_why(caplog):
    a, b, _ = _operands(PAIRS["float8_rowwise"])
    with caplog.at_level(logging.DEBUG, logger="lowp_torch"):
        y = lowp_torch.scaled_matmul(a, b, name="fc1.weight")
    assert "fc1.weight: kernel='emulated' because scaled_mm: the operands are on cpu" in caplog.text
    assert torch.equal(y, lowp_torch.scaled_matmul(a, b, kernel="emulated"))


@pytest.mark.parametrize("kernel", ["scaled_mm", "fbgemm"])
def test_an_explicit_kernel_that_cannot_run_raises_with_the_reason(kernel):
    a, b, _ = _operands(PAIRS["float8_tensorwise"])
    with pytest.raises(ValueError, match=f"fc.weight: kernel='{kernel}' cannot run this GEMM: "):
        lowp_torch.scaled_matmul(a.cpu(), b.cpu(), kernel=kernel, name="fc.weight")


def test_gemm_forms():
    form = {name: _gemm.gemm_form(*_operands(pair, n=128)[:2]) for name, pair in PAIRS.items()}
    assert form == {
        "float8_tensorwise": "tensorwise",
        "float8_rowwise": "rowwise",
        "float8_weight_only": "rowwise",
        "float8_block": "block",
        "mxfp8": "mx",
        "mxfp4": "mx",
        "nvfp4": "nvfp4",
        "tensor_e5m2_x_e4m3": "tensorwise",
        "rowwise_pow2": "rowwise",
        "rowwise_x_tensor": "rowwise",
        "block_1x128_x_1x128": "block",
        "mx_e5m2": "mx",
        "mx_fp6": None,
        "nvfp4_no_global": "nvfp4",
        "mixed_tensor_x_mx": None,
    }


def test_unaligned_shapes_raise_for_an_explicit_kernel_and_emulate_under_auto(monkeypatch, caplog):
    """K or N not a multiple of 16: never a silent skip. Pretend a GPU that could run
    the kernel, so only the shape rule decides."""
    monkeypatch.setattr(_gemm, "kernel_problem", lambda *args: None)
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(8, 100, generator=gen), torch.randn(40, 100, generator=gen)
    a = lowp_torch.quantize(x, lowp.AxisScaling())
    b = lowp_torch.quantize(w, lowp.AxisScaling())
    with pytest.raises(
        ValueError,
        match=r"proj.weight: kernel='scaled_mm' .*K=100 \(in_features\) is not a multiple of 16.*pad_to_16=True",
    ):
        lowp_torch.scaled_matmul(a, b, kernel="scaled_mm", name="proj.weight")
    with caplog.at_level(logging.WARNING, logger="lowp_torch"):
        y = lowp_torch.scaled_matmul(a, b, name="proj.weight")
    assert "proj.weight: K=100 (in_features) is not a multiple of 16" in caplog.text
    assert "so this rowwise GEMM runs emulated" in caplog.text
    assert torch.equal(y, lowp_torch.scaled_matmul(a, b, kernel="emulated"))


@pytest.mark.parametrize(
    "pair",
    [
        "float8_tensorwise",
        "float8_rowwise",
        "rowwise_x_tensor",
        "float8_block",
        "block_1x128_x_1x128",
    ],
)
def test_padding_is_exact(pair):
    """Zero-padded codes with the kernel-layout scales multiply to the unpadded product:
    checked on the CPU by emulating the kernel's scaled product in float64."""
    a, b, _ = _operands(PAIRS[pair], m=8, k=200, n=40)
    form = _gemm.gemm_form(a, b)
    padded = _kernel_product(a, b, form, pad=True)
    assert torch.allclose(padded, _kernel_product(a, b, form, pad=False), rtol=1e-12, atol=1e-12)
    unpadded, _ = exact_product(a, b, None)  # which rounds each value*scale to float32
    assert torch.allclose(padded, unpadded, rtol=1e-6, atol=1e-6)


def _kernel_product(a, b, form, pad):
    """What the kernel computes from `_padded_operands`, in float64 (codes x scales)."""
    a_codes, b_codes, a_scale, b_scale, n = _gemm._padded_operands(a, b, form, pad=pad)
    k_stored = a_codes.shape[1]
    assert a_codes.shape[1] % 16 == 0 and b_codes.shape[0] % 16 == 0 or not pad
    av, bv = a_codes.double(), b_codes.double()  # fp8 codes -> their values
    if form == "tensorwise":
        av, bv = av * a_scale.double(), bv * b_scale.double()
    elif form == "rowwise":
        av, bv = av * a_scale.double(), bv * b_scale.double().t()
    else:  # 1 x 128 tiles of a; b_scale as _scaled_mm reads it, (K/128, N/128) or (K/128, N)
        av = av * a_scale.double().repeat_interleave(128, dim=1)[:, :k_stored]
        rows = 128 if _gemm._qtensor.scheme_of(b).block == (128, 128) else 1
        b_tiles = b_scale.double().t().repeat_interleave(rows, 0)[: b_codes.shape[0]]
        bv = bv * b_tiles.repeat_interleave(128, 1)[:, :k_stored]
    return (av @ bv.t())[:, :n]


@pytest.mark.skipif(not CUDA, reason="needs CUDA: fp8 GEMM kernels")
@pytest.mark.parametrize("fast_accum", [False, True], ids=["exact_accum", "fast_accum"])
@pytest.mark.parametrize("kernel", ["scaled_mm", "fbgemm"])
@pytest.mark.parametrize(
    "pair",
    [
        "float8_tensorwise",
        "float8_rowwise",
        "rowwise_x_tensor",
        "float8_block",
        "block_1x128_x_1x128",
        "mxfp8",
        "mxfp4",
        "nvfp4",
    ],
)
def test_cuda_kernels_match_exact_product(pair, kernel, fast_accum):
    a, b, bias = _operands(PAIRS[pair], m=256, k=512, n=256, device="cuda")
    out_dtype = torch.bfloat16
    why = _gemm.kernel_problem(kernel, a, b, _gemm.gemm_form(a, b), out_dtype)
    if why is not None:
        pytest.skip(why)
    y = lowp_torch.scaled_matmul(a, b, out_dtype=out_dtype, kernel=kernel, fast_accum=fast_accum)
    y_exact, mass = exact_product(a, b, None)
    assert sqnr_db(y, y_exact) >= 40
    if not fast_accum:
        check_bound(y, y_exact, mass, a.shape[-1])
    # With a bias: some kernels add it after rounding (see scaled_matmul), so SQNR only.
    y = lowp_torch.scaled_matmul(
        a, b, out_dtype=out_dtype, bias=bias, kernel=kernel, fast_accum=fast_accum
    )
    assert sqnr_db(y, exact_product(a, b, bias)[0]) >= 40


@pytest.mark.skipif(not CUDA, reason="needs CUDA: fp8 GEMM kernels")
@pytest.mark.parametrize(
    "bias_dtype", [torch.float32, torch.bfloat16], ids=["f32_bias", "bf16_bias"]
)
@pytest.mark.parametrize("kernel", ["scaled_mm", "fbgemm"])
def test_cuda_padding_runs_unaligned_layers(kernel, bias_dtype):
    """Padded K and N, with a bias: one rounding, whether the bias rides in the
    kernel's epilogue (bf16) or is added to a float32 kernel output (f32)."""
    a, b, bias = _operands(PAIRS["float8_rowwise"], m=8, k=200, n=40, device="cuda")
    bias = bias.to(bias_dtype)
    why = _gemm.kernel_problem(kernel, a, b, "rowwise", torch.bfloat16)
    if why is not None:
        pytest.skip(why)
    y = lowp_torch.scaled_matmul(
        a, b, out_dtype=torch.bfloat16, bias=bias, kernel=kernel, pad_to_16=True
    )
    y_exact, mass = exact_product(a, b, bias)
    assert y.shape == (8, 40) and sqnr_db(y, y_exact) >= 40
    check_bound(y, y_exact, mass, 200)


@pytest.mark.skipif(not CUDA, reason="needs CUDA: kernel selection on a GPU")
def test_cuda_auto_choice(caplog):
    major, minor = torch.cuda.get_device_capability()
    expected = {
        "float8_tensorwise": "scaled_mm" if (major, minor) >= (8, 9) else "emulated",
        "float8_rowwise": "scaled_mm" if (major, minor) >= (8, 9) else "emulated",
        "float8_block": "scaled_mm" if major == 9 else "emulated",
        "mxfp8": "scaled_mm" if major >= 10 else "emulated",
    }
    for pair, kernel in expected.items():
        a, b, _ = _operands(PAIRS[pair], m=256, k=512, n=256, device="cuda")
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="lowp_torch"):
            lowp_torch.scaled_matmul(a, b, out_dtype=torch.bfloat16, name=pair)
        assert f"{pair}: kernel='{kernel}'" in caplog.text, caplog.text


@pytest.mark.parametrize("module", ["_config", "_gemm", "_qtensor"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"lowp_torch.{module}"))
    assert result.failed == 0
