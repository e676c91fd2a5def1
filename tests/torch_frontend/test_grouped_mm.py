"""lowp_torch.grouped_mm (spec §10): the grouped operands' bytes against the NumPy
reference, the GEMMs' SQNR against the high-precision grouped GEMM, autograd, compile,
and GroupedExperts."""

import ml_dtypes
import numpy as np
import pytest
import torch

import lowp
import lowp_torch
from lowp import extend
from lowp_torch import _grouped_mm, _storage

RECIPES = ("float8_rowwise", "float8_tensorwise", "mxfp8", "float8_rowwise_gw_hp", "mxfp8_gw_hp")
# empty experts, one token, all tokens in one expert, sizes off multiples of 16/32/128
SIZES = {
    "mixed": [0, 5, 40, 1, 18, 0, 33],
    "one_token": [0, 1, 0],
    "one_expert": [0, 0, 70, 0],
    "odd": [17, 129, 31, 3],
}
# torchao's MoE training thresholds (dB) for out, dgrad, wgrad
SQNR_MIN = {"mxfp8": (27, 25, 24), "float8": (18, 17, 17)}


def _offs(sizes):
    return torch.tensor(np.cumsum(sizes), dtype=torch.int32)


def _bytes(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous()
    return t.view(torch.uint8).numpy() if t.dtype != torch.float32 else t.numpy().view(np.uint8)


def _inputs(sizes, k=64, n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(sizes)
    x = (torch.randn(t, k, generator=g) * 3).to(torch.bfloat16)
    w = (torch.randn(len(sizes), n, k, generator=g) * 0.1).to(torch.bfloat16)
    dy = torch.randn(t, n, generator=g).to(torch.bfloat16)
    return x, w, dy


@pytest.mark.parametrize("sizes", sorted(SIZES))
@pytest.mark.parametrize("recipe", RECIPES)
def test_operands_are_the_reference_bytes(recipe, sizes):
    sizes = SIZES[sizes]
    x, w, dy = _inputs(sizes)
    if sum(sizes) > 10:
        x[7, 3] = float("nan")  # poisons its expert's groups only
    ops = lowp_torch.grouped_operands(x, w, dy, _offs(sizes), recipe)
    plan = extend.GroupedPlan.of(lowp.Recipe.from_name(recipe))
    tensors = {"x": x, "w": w, "g": dy, "w.T": w.transpose(-2, -1), "g.T": dy, "x.T": x}
    for gemm in plan.gemms():
        for op, (codes, scale) in zip((gemm.a, gemm.b), ops[gemm.name], strict=True):
            hp = tensors[op.tensor].float().numpy().astype(ml_dtypes.bfloat16)
            ref = extend.quantize_grouped(hp, op.scheme, sizes, op.kind)
            np.testing.assert_array_equal(_bytes(codes), ref.codes, err_msg=op.tensor)
            np.testing.assert_array_equal(_bytes(scale), ref.scale.view(np.uint8), op.tensor)


def _sqnr(a, ref):
    a, ref = a.detach().float(), ref.detach().float()
    return float(20 * torch.log10(ref.norm() / (a - ref).norm()))


@pytest.mark.parametrize("recipe", RECIPES)
def test_sqnr_against_the_high_precision_grouped_gemm(recipe):
    sizes = [0, 100, 37, 256, 1, 118]
    x, w, dy = _inputs(sizes, k=256, n=128, seed=1)
    offs = _offs(sizes)
    x.requires_grad_()
    w.requires_grad_()
    y = lowp_torch.grouped_mm(x, w, offs, recipe)
    y.backward(dy)
    xf, wf, gf = x.detach().float(), w.detach().float(), dy.float()
    y_ref = _grouped_mm._grouped_f32(xf, wf, offs)
    dx_ref = _grouped_mm._grouped_f32(gf, wf.transpose(-2, -1), offs)
    dw_ref = _grouped_mm._grouped_wgrad_f32(gf, xf, offs)
    minimum = SQNR_MIN["mxfp8" if recipe.startswith("mx") else "float8"]
    got = (_sqnr(y, y_ref), _sqnr(x.grad, dx_ref), _sqnr(w.grad, dw_ref))
    assert all(s >= m for s, m in zip(got, minimum, strict=True)), got
    assert (w.grad[0] == 0).all()  # an expert without tokens has no gradient
    assert y.dtype == x.grad.dtype == w.grad.dtype == torch.bfloat16


def test_nan_in_one_expert_stays_there():
    sizes = [16, 16, 16]
    x, w, dy = _inputs(sizes)
    x[20, 1] = float("inf")
    x.requires_grad_()
    w.requires_grad_()
    y = lowp_torch.grouped_mm(x, w, _offs(sizes), "mxfp8")
    y.backward(dy)
    assert y[16:32].isnan().any() and not y[:16].isnan().any() and not y[32:].isnan().any()
    assert w.grad[1].isnan().any() and not w.grad[0].isnan().any() and not w.grad[2].isnan().any()


def test_bad_input_is_named():
    x, w, _ = _inputs([4, 4])
    with pytest.raises(ValueError, match=r"sum to 7, the input has 8"):
        lowp_torch.grouped_mm(x, w, torch.tensor([3, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match="int32"):
        lowp_torch.grouped_mm(x, w, torch.tensor([4, 8]))
    with pytest.raises(ValueError, match="dgrad GEMM cannot quantize g along N = 48"):
        lowp_torch.grouped_mm(
            x, torch.zeros(2, 48, 64), torch.tensor([4, 8], dtype=torch.int32), "mxfp8"
        )
    with pytest.raises(ValueError, match="kernel='scaled_grouped_mm' cannot run it: cpu"):
        lowp_torch.grouped_mm(
            x, w, torch.tensor([4, 8], dtype=torch.int32), kernel="scaled_grouped_mm"
        )


def test_masked_emulation_equals_grouped_mm():
    """The compiled path's emulation (masked dense GEMMs) against torch._grouped_mm's."""
    sizes = [0, 5, 40, 1, 18]
    x, w, dy = (t.float() for t in _inputs(sizes))
    x[3, 2] = float("nan")
    offs = _offs(sizes)
    y, y_masked = _grouped_mm._grouped_f32(x, w, offs), _grouped_mm._masked_f32(x, w, offs)
    torch.testing.assert_close(y_masked, y, equal_nan=True)
    dw = _grouped_mm._grouped_wgrad_f32(dy, x, offs)
    torch.testing.assert_close(_grouped_mm._masked_wgrad_f32(dy, x, offs), dw, equal_nan=True)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["float8_rowwise", "mxfp8"])
def test_compiled_equals_eager(recipe):
    sizes = [0, 20, 12, 32]
    x, w, dy = (t.float() for t in _inputs(sizes))
    offs = _offs(sizes)
    grads = []
    for fn in (lowp_torch.grouped_mm, torch.compile(lowp_torch.grouped_mm)):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xr, wr, offs, recipe)
        y.backward(dy)
        grads.append((y.detach(), xr.grad, wr.grad))
    for eager, compiled in zip(*grads, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_grouped_experts_converts_and_trains():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"experts": lowp_torch.GroupedExperts(64, 128, 4)})
    counts = torch.tensor([10, 0, 33, 21])
    x = torch.randn(64, 64)
    ref = model["experts"](x, counts)
    lowp_torch.convert_experts_to_training(model, "float8_rowwise")
    experts = model["experts"]
    assert experts.recipe == "float8_rowwise"
    out = experts(x, counts)
    assert _sqnr(out, ref) > 18
    out.square().mean().backward()
    assert experts.w1.grad is not None and (experts.w1.grad[1] == 0).all()


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.skipif(not _sm90(), reason="torch._scaled_grouped_mm needs CUDA sm_90+")
@pytest.mark.parametrize("sizes", [[0, 32, 16, 208], [64, 64, 64, 64]])
def test_scaled_grouped_mm_matches_the_emulation(sizes):
    """The fp8 grouped GEMMs (spec §7: >= 40 dB against the dequantized operands'
    product, which the emulation computes) on the same operands' bytes."""
    x, w, dy = (t.cuda() for t in _inputs(sizes, k=256, n=128, seed=2))
    offs = _offs(sizes).cuda()
    results = []
    for kernel in ("scaled_grouped_mm", "emulated"):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = lowp_torch.grouped_mm(xr, wr, offs, "float8_rowwise", kernel=kernel)
        y.backward(dy)
        results.append((y, xr.grad, wr.grad))
    for fast, emulated in zip(*results, strict=True):
        assert _sqnr(fast, emulated) >= 40


@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8", "float8_weight_only"])
def test_quantized_experts_for_inference(preset):
    """quantize_experts_: QuantizedTensor expert weights (E, N, K), the bytes of the
    grouped reference's experts, and outputs close to the high-precision layer's."""
    torch.manual_seed(0)
    experts = lowp_torch.GroupedExperts(64, 128, 4)
    counts = torch.tensor([10, 0, 33, 21])
    x = torch.randn(64, 64)
    with torch.no_grad():
        ref = experts(x, counts)
        w1 = experts.w1.detach().clone()
        lowp_torch.quantize_experts_(experts, preset)
        out = experts(x, counts)
    q = experts.w1
    assert isinstance(q, lowp_torch.QuantizedTensor) and tuple(q.shape) == (4, 128, 64)
    scheme = lowp.InferenceConfig.from_name(preset).weight
    want = extend.quantize_grouped(w1.numpy(), scheme, [1, 1, 1, 1], "experts")
    np.testing.assert_array_equal(_bytes(q.codes), want.codes)
    assert _sqnr(out, ref) > 18


def test_tensorwise_expert_weights_are_refused():
    experts = lowp_torch.GroupedExperts(32, 64, 2)
    with pytest.raises(ValueError, match="one scale for every expert"):
        lowp_torch.quantize_experts_(experts, "float8_tensorwise")


# The wgrad operands' Triton kernels (`_triton_grouped`) under the CPU interpreter, in a
# subprocess: triton reads TRITON_INTERPRET when a kernel is defined.
_INTERPRETED = """
import json, ml_dtypes, numpy as np, torch, lowp, lowp_torch
from lowp import extend
from lowp_torch import _grouped_mm, _storage
bad = []
for sizes in {sizes}:
    for dtype in (torch.float32, torch.bfloat16):
        for scheme in (lowp.AxisScaling("float8_e4m3fn", -1), lowp.AxisScaling("float8_e5m2", -1, pow2=True),
                       lowp.MXScaling("float8_e4m3fn", block=32), lowp.MXScaling("float8_e5m2", block=32, mode="ceil")):
            g = torch.Generator().manual_seed(len(sizes))
            t = (torch.randn(sum(sizes), 70, generator=g) * 4).to(dtype)
            if sum(sizes) > 10:
                t[sum(sizes) - 3, 5] = float("nan")  # poisons the last expert's groups only
            op = extend.GroupedOperand("x.T", "tokens", scheme)
            offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
            with lowp_torch.cast_kernels("triton"):
                codes, scale = _grouped_mm.quantize_operand(t, op, _grouped_mm.group_sizes(offs, sum(sizes)), offs=offs)
            hp = t.float().numpy().astype(ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float32)
            ref = extend.quantize_grouped(hp, scheme, sizes, "tokens")
            got_scale = scale.contiguous().view(torch.uint8).numpy() if scale.dtype != torch.float32 else scale.contiguous().numpy().view(np.uint8)
            if not (np.array_equal(codes.contiguous().view(torch.uint8).numpy(), ref.codes)
                    and np.array_equal(got_scale, np.ascontiguousarray(ref.scale).view(np.uint8))):
                bad.append([sizes, str(dtype), scheme.spec])
# the dgrad's w.T, cast from w (E, N, K) in place: codes (E, K, N) contiguous
for e, n, k in ((1, 1, 1), (3, 70, 33), (4, 130, 18), (2, 0, 8), (2, 8, 0)):
    for scheme in (lowp.AxisScaling("float8_e4m3fn", -1, pow2=True), lowp.AxisScaling("float8_e5m2", -1),
                   lowp.MXScaling("float8_e4m3fn", block=2), lowp.MXScaling("float8_e5m2", block=2, mode="ceil")):
        if isinstance(scheme, lowp.MXScaling) and n % 2:
            continue
        g = torch.Generator().manual_seed(n * k + e)
        w = (torch.randn(e, n, k, generator=g) * 3).to(torch.bfloat16)
        if w.numel() > 10:
            w[e - 1, n // 2, 3] = float("nan")  # poisons one column group of the last expert
        op = extend.GroupedOperand("w.T", "experts", scheme)
        with lowp_torch.cast_kernels("triton"):
            codes, scale = _grouped_mm.quantize_operand(w.transpose(-2, -1), op, torch.ones(e, dtype=torch.int64))
        ref = extend.quantize_grouped(w.transpose(-2, -1).float().numpy().astype(ml_dtypes.bfloat16), scheme, [1] * e, "experts")
        got_scale = scale.contiguous().view(torch.uint8).numpy() if scale.dtype != torch.float32 else scale.contiguous().numpy().view(np.uint8)
        if not (codes.is_contiguous() and np.array_equal(codes.view(torch.uint8).numpy(), ref.codes)
                and np.array_equal(got_scale, np.ascontiguousarray(ref.scale).view(np.uint8))):
            bad.append(["w.T", [e, n, k], scheme.spec])
# tokens past offs[-1] (no group holds them) get code 0, whatever the buffer held
from lowp_torch import _triton_grouped
for scheme in (lowp.AxisScaling("float8_e4m3fn", -1), lowp.MXScaling("float8_e4m3fn", block=32)):
    for sizes, tokens in (([5, 0, 70], 140), ([0], 3), ([3, 4], 7)):
        torch.full((70, tokens), 255, dtype=torch.uint8)  # garbage for empty() to reuse
        t = torch.randn(tokens, 70, generator=torch.Generator().manual_seed(tokens))
        offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
        codes, _ = _triton_grouped.launch_tokens(t, offs, scheme)
        end = sum(sizes)
        ref = extend.quantize_grouped(t[:end].numpy(), scheme, sizes, "tokens")
        if not (np.array_equal(codes[:, :end].numpy(), ref.codes) and not codes[:, end:].any()):
            bad.append(["padding", sizes, tokens, scheme.spec])
# dy's two casts (dgrad rows, wgrad tokens) from one pass, as float8_rowwise's backward takes them
plan = extend.GroupedPlan.of(lowp.Recipe.from_name("float8_rowwise"))
launch = _triton_grouped.launch_rows_and_tokens
fused = []
_triton_grouped.launch_rows_and_tokens = lambda *a: fused.append(1) or launch(*a)
for sizes in {sizes}:
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(len(sizes) + 7)
        dy = (torch.randn(sum(sizes), 70, generator=g) * 4).to(dtype)
        if sum(sizes) > 10:
            dy[sum(sizes) - 3, 5] = float("nan")  # poisons a row, and a group of the last expert
        offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
        with lowp_torch.cast_kernels("triton"):
            ops = _grouped_mm._dy_operands(dy, plan, _grouped_mm.group_sizes(offs, sum(sizes)), offs, "dy")
        hp = dy.float().numpy().astype(ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float32)
        for gemm, kind in (("dgrad", "rows"), ("wgrad", "tokens")):
            codes, scale = ops[gemm]
            ref = extend.quantize_grouped(hp, plan.dgrad.a.scheme, sizes, kind)
            if not (np.array_equal(codes.contiguous().view(torch.uint8).numpy(), ref.codes)
                    and np.array_equal(scale.contiguous().numpy().view(np.uint8), np.ascontiguousarray(ref.scale).view(np.uint8))
                    and scale.shape == ref.scale.shape):
                bad.append(["dy", gemm, sizes, str(dtype)])
_triton_grouped.launch_rows_and_tokens = launch
if len(fused) != 2 * len([s for s in {sizes} if sum(s)]):
    bad.append(["dy casts not fused", len(fused)])
# the codes reach the GEMMs as codes: the whole layer's gradients equal the torch path's
sizes = [0, 20, 12, 33]
g = torch.Generator().manual_seed(1)
x, w = torch.randn(65, 64, generator=g), torch.randn(4, 32, 64, generator=g) * 0.1
dy, offs = torch.randn(65, 32, generator=g), torch.tensor(np.cumsum(sizes), dtype=torch.int32)
for recipe in ("float8_rowwise", "mxfp8"):
    grads = []
    for mode in ("torch", "triton"):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        with lowp_torch.cast_kernels(mode):
            lowp_torch.grouped_mm(xr, wr, offs, recipe).backward(dy)
        grads.append((xr.grad, wr.grad))
    if not all(torch.equal(a, b) for a, b in zip(*grads)):
        bad.append(["grouped_mm", recipe])
print(json.dumps(bad))
"""


@pytest.mark.slow
def test_wgrad_operand_kernels_are_the_reference_bytes_interpreted():
    """Empty experts, one token, all in one expert, groups not a multiple of the block
    (or of the kernels' 64-token tiles), NaN in one expert: the bytes of the reference;
    the tokens past the last expert's (padding) zero; dy's rows and tokens casts from one
    pass (float8_rowwise's backward); and the dgrad's w.T cast from w in place (empty
    and one-element experts, dims off the 64 x 64 tiles, NaN in one expert)."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    code = _INTERPRETED.format(sizes=[SIZES[k] for k in sorted(SIZES)] + [[0, 0, 0], [130]])
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    run = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


@pytest.mark.slow  # torch.compile
@pytest.mark.parametrize("recipe", ["float8_rowwise", "float8_rowwise_gw_hp"])
def test_compiled_graphs_have_no_float32_grouped_mm(recipe, monkeypatch):
    """No compiled graph calls the float32 `torch._grouped_mm`. Where AOTAutograd traces
    the backward (torch 2.11: fake tensors, `torch.compiler.is_compiling()` False) the
    backward took it, and Inductor's result was wrong wholesale (the dgrad of
    test_compiled_equals_eager on the H200 machine). On torch 2.13 the backward of
    this autograd.Function runs eagerly, so here the test passes either way."""
    sizes = [0, 20, 12, 32]
    x, w, dy = (t.float() for t in _inputs(sizes))
    offs = _offs(sizes)
    eager_grouped_mm = torch._grouped_mm

    def refuse_traced(*args, **kwargs):
        assert not any(_storage.traced(a) for a in args), "_grouped_mm traced"
        return eager_grouped_mm(*args, **kwargs)

    monkeypatch.setattr(torch, "_grouped_mm", refuse_traced)
    torch._dynamo.reset()
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    torch.compile(lowp_torch.grouped_mm, backend="aot_eager")(xr, wr, offs, recipe).backward(dy)
    assert xr.grad is not None and wr.grad is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels run on CUDA")
@pytest.mark.parametrize("sizes", [[0, 5, 40, 1, 18, 0, 33], [2048] * 8, [0, 4000, 96, 0]])
@pytest.mark.parametrize("recipe", ["float8_rowwise", "mxfp8"])
def test_wgrad_operand_kernels_on_cuda_are_the_reference_bytes(recipe, sizes):
    """`_triton_grouped` on the GPU (native fp8 conversion on sm_90+) against the
    NumPy reference, at sizes that span many of its tiles."""
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(sum(sizes), 320, generator=g) * 5).to(torch.bfloat16)
    t[sum(sizes) // 2, 7] = float("nan")
    offs = _offs(sizes)
    op = extend.GroupedPlan.of(lowp.Recipe.from_name(recipe)).wgrad.b
    with lowp_torch.cast_kernels("triton"):
        codes, scale = _grouped_mm.quantize_operand(
            t.cuda(), op, _grouped_mm.group_sizes(offs.cuda(), sum(sizes)), offs=offs.cuda()
        )
    ref = extend.quantize_grouped(
        t.float().numpy().astype(ml_dtypes.bfloat16), op.scheme, sizes, "tokens"
    )
    np.testing.assert_array_equal(_bytes(codes.cpu()), ref.codes)
    np.testing.assert_array_equal(
        _bytes(scale.cpu()), np.ascontiguousarray(ref.scale).view(np.uint8)
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels run on CUDA")
@pytest.mark.parametrize("recipe", ["float8_rowwise", "mxfp8"])
def test_dgrad_weight_cast_on_cuda_is_the_reference_bytes(recipe):
    """The dgrad's w.T, cast on the GPU from w (E, N, K) in place (no transposing copy),
    against the NumPy reference of w.T, at dims spanning many 64 x 64 tiles."""
    from lowp_torch import _triton_casts

    g = torch.Generator().manual_seed(4)
    w = (torch.randn(3, 320, 224, generator=g) * 0.1).to(torch.bfloat16)
    w[1, 17, 5] = float("nan")
    op = extend.GroupedPlan.of(lowp.Recipe.from_name(recipe)).dgrad.b
    wt = w.cuda().transpose(-2, -1)
    assert _triton_casts.transposed_source(wt, op.scheme) is not None
    with lowp_torch.cast_kernels("triton"):
        codes, scale = _grouped_mm.quantize_operand(wt, op, torch.ones(3, device="cuda"))
    ref = extend.quantize_grouped(
        w.transpose(-2, -1).float().numpy().astype(ml_dtypes.bfloat16),
        op.scheme,
        [1] * 3,
        "experts",
    )
    assert codes.is_contiguous()
    np.testing.assert_array_equal(_bytes(codes.cpu()), ref.codes)
    np.testing.assert_array_equal(
        _bytes(scale.cpu()), np.ascontiguousarray(ref.scale).view(np.uint8)
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels run on CUDA")
@pytest.mark.parametrize("sizes", [[0, 5, 40, 1, 18, 0, 33], [2048] * 8, [0, 4000, 96, 0]])
def test_fused_dy_casts_on_cuda_are_the_reference_bytes(sizes):
    """float8_rowwise's backward casts dy for the dgrad (rows) and the wgrad (tokens) in
    one pass on the GPU: each the NumPy reference's bytes."""
    g = torch.Generator().manual_seed(5)
    dy = (torch.randn(sum(sizes), 320, generator=g) * 5).to(torch.bfloat16)
    dy[sum(sizes) // 2, 7] = float("nan")
    offs = _offs(sizes).cuda()
    plan = extend.GroupedPlan.of(lowp.Recipe.from_name("float8_rowwise"))
    with lowp_torch.cast_kernels("triton"):
        ops = _grouped_mm._dy_operands(
            dy.cuda(), plan, _grouped_mm.group_sizes(offs, sum(sizes)), offs, "dy"
        )
    hp = dy.float().numpy().astype(ml_dtypes.bfloat16)
    for gemm, kind in (("dgrad", "rows"), ("wgrad", "tokens")):
        codes, scale = ops[gemm]
        ref = extend.quantize_grouped(hp, plan.dgrad.a.scheme, sizes, kind)
        np.testing.assert_array_equal(_bytes(codes.cpu()), ref.codes, err_msg=gemm)
        assert tuple(scale.shape) == ref.scale.shape
        np.testing.assert_array_equal(
            _bytes(scale.cpu()), np.ascontiguousarray(ref.scale).view(np.uint8), err_msg=gemm
        )


# The eager CUDA path of float8_rowwise on the CPU: Triton casts under the interpreter,
# `torch._scaled_grouped_mm` stubbed (it records its operands' layouts).
_CUDA_PATH = """
import json, numpy as np, torch, lowp_torch
from torch.utils._python_dispatch import TorchDispatchMode
from lowp_torch import _grouped_mm

gemms = []
def scaled_grouped_mm(a, b, sa, sb, offs=None, out_dtype=None, use_fast_accum=False):
    gemms.append([list(a.stride()), list(b.stride()), sa.is_contiguous(), sb.is_contiguous()])
    if b.dim() == 3:
        return torch.zeros(a.shape[0], b.shape[-1], dtype=out_dtype)
    return torch.zeros(offs.shape[0], a.shape[0], b.shape[1], dtype=out_dtype)
torch._scaled_grouped_mm = scaled_grouped_mm
_grouped_mm._scaled_grouped_problem = lambda *args: None

class Copies(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.sizes = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import traceback
        if func._opname in ("clone", "copy_", "_to_copy") and not any(
            "interpreter.py" in f.filename for f in traceback.extract_stack()
        ):  # the interpreter's own copies of kernel arguments are no copies on CUDA
            self.sizes.append(max(a.numel() for a in args if isinstance(a, torch.Tensor)))
        return func(*args, **(kwargs or {}))

sizes = [0, 32, 16, 80]
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 64, generator=g).bfloat16().requires_grad_()
w = (torch.randn(4, 48, 64, generator=g) * 0.1).bfloat16().requires_grad_()
dy = torch.randn(128, 48, generator=g).bfloat16()
offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
with lowp_torch.cast_kernels("triton"), Copies() as copies:
    lowp_torch.grouped_mm(x, w, offs).backward(dy)
print(json.dumps({"gemms": gemms, "copies": copies.sizes}))
"""


@pytest.mark.slow
def test_eager_cuda_path_copies_nothing_and_passes_the_fast_layouts():
    """float8_rowwise's eager CUDA path, run on the CPU: no copy of an operand on the
    way (the one copy is offs to the host), and each GEMM gets a row-major a and a
    column-major b (torchao 0.18's `_Float8GroupedMM` layouts), contiguous scales."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    run = subprocess.run(
        [sys.executable, "-c", _CUDA_PATH], check=False, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["copies"] == [4], result  # offs (E,) to the host, once
    t, k, n = 128, 64, 48
    assert result["gemms"] == [
        [[k, 1], [n * k, 1, k], True, True],  # forward: x (T, K); w.T (E, K, N) column-major
        [[n, 1], [k * n, 1, n], True, True],  # dgrad: dy (T, N); w (E, N, K) column-major
        [[t, 1], [1, t], True, True],  # wgrad: dy.T (N, T); x (T, K) column-major
    ]
