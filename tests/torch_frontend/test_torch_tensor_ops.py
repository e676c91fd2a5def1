"""QuantizedTensor as a torch.Tensor: every aten op a model needs, for every scheme.

`test_op` is the one table-driven integration test: each op of `OPS` runs on a
QuantizedTensor of each scheme of `SCHEMES` (every preset's weight scheme, the
activation-only 1x128 blocks, and the other element formats: e5m2, float6, fp4
tensorwise, NVFP4 without a global scale), and the result is checked against the
same op on the dequantized tensor, bit for bit. Each op has one documented outcome
per scheme: "exact" (the result is quantized and dequantizes to the reference),
"dequantized" (no quantized form exists; the result is the plain reference tensor and
a warning is logged), or "raises" (a ValueError naming the op and the scheme).

Why each op is in the table:

- detach: `nn.Parameter(q)` and `state_dict()` detach their tensors.
- clone: `copy.deepcopy(model)` and `state_dict` consumers clone.
- to_cpu / to_cuda (`aten._to_copy` with a device): `model.to(device)`.
- to_bf16 (`aten._to_copy` with a dtype): `model.bfloat16()`: the codes stay, the
  tensor dequantizes to the new dtype.
- copy_q / copy_plain (`aten.copy_`): `load_state_dict` into a quantized model, from a
  quantized checkpoint (bytes copied) or a float one (re-quantized with the scheme).
- t, transpose, permute: hand-written `x @ w.t()` / `w.T`; a transposed weight is the
  column-major operand `torch._scaled_mm` takes.
- reshape / view: flattening stacked (expert) weights (E, N, K) <-> (E*N, K), and the
  activation's (..., K) -> (M, K) inside linear.
- slice_rows / slice_k / slice_k_cut / split / chunk: splitting fused QKV or gate-up
  weights along out_features, and tensor-parallel shards along in_features.
- select: `w[e]` of a stacked expert weight.
- cat: fusing Q, K and V weights into one projection.
- linear, mm, matmul, addmm, bmm: the forward GEMMs (`F.linear` of nn.Linear; the
  `mm`/`addmm` it decomposes into elsewhere; `bmm` for batched expert weights).
- save_load: `torch.save` / `torch.load(weights_only=True)` of a state dict.
"""

import io
import logging

import pytest
import torch
import torch.nn.functional as F

import lowp
import lowp_torch

E4M3, E5M2, E2M1 = "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"


def _scheme_id(s) -> str:
    fields = ",".join(f"{v}" for k, v in vars(s).items() if k not in ("mode",))
    return f"{type(s).__name__}({fields})"


_PRESET_WEIGHTS = [lowp.InferenceConfig.from_name(n).weight for n in lowp.InferenceConfig.names()]
SCHEMES = list(dict.fromkeys(_PRESET_WEIGHTS)) + [
    lowp.BlockScaling(E4M3, block=(1, 128)),  # float8_block's activation scheme
    lowp.TensorScaling(E5M2),
    lowp.AxisScaling("float6_e3m2fn"),
    lowp.MXScaling(E5M2, mode="floor"),
    lowp.MXScaling("float6_e2m3fn", mode="ceil"),
    lowp.TensorScaling(E2M1),
    lowp.NVFP4Scaling(global_scale=False),
    lowp.GroupScaling(E4M3, block=32),  # a core-only scheme: no frontend code of its own
]

_GEN = torch.Generator().manual_seed(0)
W2 = torch.randn(128, 256, generator=_GEN)  # (N, K), as nn.Linear stores a weight
W3 = torch.randn(2, 128, 256, generator=_GEN)  # stacked (E, N, K) expert weights
X2 = torch.randn(3, 256, generator=_GEN)
X3 = torch.randn(2, 3, 256, generator=_GEN)
BIAS = torch.randn(128, generator=_GEN)


def _fp4(s):
    return s.fmt == E2M1


def _kind(s):
    return type(s).__name__


def _block(s):
    return getattr(s, "block", None)


def _exact_unless(raises=lambda s: False, dequantizes=lambda s: False):
    return lambda s: "raises" if raises(s) else "dequantized" if dequantizes(s) else "exact"


def _save_load(t):
    buffer = io.BytesIO()
    torch.save({"w": t}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["w"]


def _copy_into(dst, src):
    dst.copy_(src)
    return dst


# name: (input, op, outcome(scheme)). The input is quantized fresh for every case.
OPS = {
    "detach": ("w2", lambda t: t.detach(), _exact_unless()),
    "clone": ("w2", lambda t: t.clone(), _exact_unless()),
    "to_cpu": ("w2", lambda t: t.to("cpu", copy=True), _exact_unless()),
    "to_bf16": ("w2", lambda t: t.to(torch.bfloat16), _exact_unless()),
    "copy_q": ("w2", lambda t: _copy_into(t.clone(), t), _exact_unless()),
    "save_load": ("w2", _save_load, _exact_unless()),
    "t": ("w2", lambda t: t.t(), _exact_unless(dequantizes=_fp4)),
    "transpose_batch": (
        "w3",
        lambda t: t.transpose(0, 1),
        _exact_unless(dequantizes=lambda s: _kind(s) == "BlockScaling"),
    ),
    "permute_last": ("w3", lambda t: t.permute(0, 2, 1), _exact_unless(dequantizes=_fp4)),
    "reshape_merge": ("w3", lambda t: t.reshape(256, 256), _exact_unless()),
    "view_split_k": (
        "w2",
        lambda t: t.view(128, 2, 128),
        _exact_unless(raises=lambda s: _kind(s) != "TensorScaling"),
    ),
    "slice_rows": (
        "w2",
        lambda t: t[32:96],
        _exact_unless(raises=lambda s: _block(s) == (128, 128)),
    ),
    "slice_k": (
        "w2",
        lambda t: t[:, 64:192],
        _exact_unless(raises=lambda s: _kind(s) == "BlockScaling"),
    ),
    "slice_k_cut": (
        "w2",
        lambda t: t[:, 8:40],
        # columns 8:40 cut the groups of 16 or more consecutive elements along K
        _exact_unless(raises=lambda s: 8 % (s.tiles(2)[-1] or 8) != 0),
    ),
    "split": (
        "w2",
        lambda t: torch.split(t, 64),
        _exact_unless(raises=lambda s: _block(s) == (128, 128)),
    ),
    "chunk_k": ("w2", lambda t: torch.chunk(t, 2, dim=1), _exact_unless()),
    "select": ("w3", lambda t: t[1], _exact_unless()),
    "cat": (
        "w3",
        lambda t: torch.cat([t[0], t[1]], dim=0),
        _exact_unless(),  # parts of one tensor share tensorwise / global scales
    ),
    "linear": ("w2", lambda t: F.linear(X3, t, BIAS), _exact_unless()),
    "mm": ("w2", lambda t: torch.mm(X2, t.t()), _exact_unless(dequantizes=_fp4)),
    "matmul": ("w2", lambda t: X3 @ t.T, _exact_unless(dequantizes=_fp4)),
    "addmm": ("w2", lambda t: torch.addmm(BIAS, X2, t.t()), _exact_unless(dequantizes=_fp4)),
    "bmm": (
        "w3",
        lambda t: torch.bmm(X3, t.transpose(1, 2)),
        _exact_unless(dequantizes=_fp4),
    ),
}
GEMMS = ("linear", "mm", "matmul", "addmm", "bmm")


@pytest.mark.parametrize("scheme", SCHEMES, ids=_scheme_id)
@pytest.mark.parametrize("op_name", list(OPS))
def test_op(op_name, scheme, caplog):
    """Every op x every scheme, against the op on the dequantized tensor, bit for bit.

    GEMMs with a bare QuantizedTensor (no LinearConfig, as `quantize` returns it)
    multiply by its dequantized values in the input's dtype, so they too are exact;
    the quantized-activation GEMMs are checked by SQNR in test_torch_gemm.py.
    """
    which, op, outcome = OPS[op_name]
    q = lowp_torch.quantize(W2 if which == "w2" else W3, scheme)
    reference = op(q.dequantize())
    expected = outcome(scheme)
    with caplog.at_level(logging.WARNING, logger="lowp_torch"):
        if expected == "raises":
            with pytest.raises(ValueError) as info:
                op(q)
            message = str(info.value)
            assert type(scheme).__name__ in message, message
            assert any(word in message for word in ("slice", "view", "cat", "select", "split")), (
                message
            )
            return
        result = op(q)
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    references = list(reference) if isinstance(reference, (list, tuple)) else [reference]
    for got, want in zip(results, references, strict=True):
        if op_name in GEMMS:
            assert type(got) is torch.Tensor
        elif expected == "exact":
            assert isinstance(got, lowp_torch.QuantizedTensor), type(got)
            assert got.shape == want.shape and got.dtype == want.dtype
            got = got.dequantize()
        else:
            assert type(got) is torch.Tensor
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(
            got.view(torch.int16 if got.dtype != torch.float32 else torch.int32),
            want.view(torch.int16 if want.dtype != torch.float32 else torch.int32),
        )
    if expected == "dequantized":
        assert "dequantizing" in caplog.text or not caplog.text  # logged once per cause


def test_copy_of_a_float_tensor_requantizes():
    """load_state_dict of a float checkpoint into a quantized model: copy_ quantizes."""
    for scheme in SCHEMES:
        q = lowp_torch.quantize(W2, scheme)
        target = lowp_torch.quantize(torch.zeros_like(W2), scheme)
        target.copy_(W2)
        assert torch.equal(target.dequantize(), q.dequantize()), scheme
        plain = torch.empty_like(W2)
        plain.copy_(q)
        assert torch.equal(plain, q.dequantize()), scheme


def test_cat_refuses_tensors_whose_single_scale_differs():
    for scheme in (lowp.TensorScaling(), lowp.NVFP4Scaling()):
        a, b = lowp_torch.quantize(W2, scheme), lowp_torch.quantize(2 * W2, scheme)
        with pytest.raises(ValueError, match=f"cat: .*{type(scheme).__name__}.*different"):
            torch.cat([a, b])
    a, b = (
        lowp_torch.quantize(W2, lowp.AxisScaling()),
        lowp_torch.quantize(2 * W2, lowp.AxisScaling()),
    )
    assert torch.equal(torch.cat([a, b]).dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_strict_makes_a_transpose_without_quantized_form_an_error():
    q = lowp_torch.quantize(W2, lowp.NVFP4Scaling())
    strict = q.replace(linear=lowp_torch.LinearConfig(name="fc.weight", strict=True))
    with pytest.raises(ValueError, match=r"aten::t of 'fc.weight' .*packed fp4.*strict"):
        strict.t()
    transposed = lowp_torch.quantize(W2, lowp.AxisScaling()).t()
    assert transposed.scheme == lowp.AxisScaling(axis=-2)  # the scale axis follows
    assert not transposed.is_contiguous() and transposed.codes.stride() == (1, 256)


def test_unknown_ops_name_themselves():
    q = lowp_torch.quantize(W2, lowp.AxisScaling())
    with pytest.raises(
        NotImplementedError, match="does not implement aten::add.Tensor.*dequantize"
    ):
        q + 1
    with pytest.raises(TypeError, match="dtype it dequantizes to"):
        q.to(torch.float8_e4m3fn)


def test_fields_are_read_only_and_checked():
    q = lowp_torch.quantize(W2, lowp.MXScaling())
    with pytest.raises(AttributeError):
        q.scheme = lowp.MXScaling(mode="ceil")
    with pytest.raises(ValueError, match="scale must have shape"):
        q.replace(scale=q.scale[:1])
    assert q.requires_grad is False and q.dtype == torch.float32 and q.shape == W2.shape


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: moves and pins across devices"
)
@pytest.mark.parametrize("scheme", SCHEMES, ids=_scheme_id)
def test_device_moves_and_pin_memory(scheme):
    q = lowp_torch.quantize(W2, scheme)
    on_gpu = q.to("cuda")
    assert on_gpu.codes.is_cuda and on_gpu.scale.is_cuda
    back = on_gpu.cpu().pin_memory()
    assert back.is_pinned() and back.codes.is_pinned()
    assert torch.equal(back.dequantize(), q.dequantize())


@pytest.mark.slow
def test_compiled_shape_ops_match_eager():
    """A transposed, sliced weight inside torch.compile: same result as eager."""
    q = lowp_torch.quantize(W2, lowp.AxisScaling())

    def f(x, w):
        return x @ w[:64].t()

    eager = f(X2, q)
    compiled = torch.compile(f, fullgraph=True)(X2, q)
    assert torch.equal(eager, compiled)
