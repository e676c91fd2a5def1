"""Low-precision training in PyTorch (spec §8): lowp_torch.Linear, convert_to_training,
quantize_ with a Recipe, to_inference.

- every GEMM operand has the bytes `lowp.quantize` gives the right orientation of the
  high-precision tensor, and the autograd Function multiplies exactly those operands;
- per-GEMM SQNR against high precision at torchao's thresholds, rank-2 and rank-3;
- exact resume, torch.compile, activation checkpointing, float32 weight-gradient
  accumulation, training -> inference, and errors that name the layer.
"""

import copy
import dataclasses
import io
import logging

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import lowp
import lowp_torch
from lowp_torch import _gemm

RECIPES = lowp.Recipe.names()
K, N = 128, 96
INPUT_SHAPES = {"rank2": (64, K), "rank3": (3, 32, K)}
# torchao's training thresholds (float8: test/float8/test_base.py; mx: test/prototype/mx_formats).
MIN_SQNR = {
    "float8": {"forward": 18.0, "dgrad": 18.0, "wgrad": 17.0},
    "mxfp8": {"forward": 27.0, "dgrad": 25.0, "wgrad": 24.0},
}


def _tensors(shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    w = torch.randn(N, K, generator=gen) * 0.05
    b = torch.randn(N, generator=gen)
    g = torch.randn(shape[:-1] + (N,), generator=gen)
    return x.to(dtype), w.to(dtype), b.to(dtype), g.to(dtype)


def sqnr_db(y, reference) -> float:
    error = (y.double() - reference.double()).norm()
    return (
        float("inf") if error == 0 else float(20 * torch.log10(reference.double().norm() / error))
    )


def _layer_grads(layer, x, g):
    """y, dx, dw, db of `layer(x)` backpropagating g (the layer's grads zeroed first)."""
    layer.zero_grad()
    x = x.detach().clone().requires_grad_()
    y = layer(x)
    y.backward(g)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _reference_grads(x, w, b, g):
    """The same in float64: the high-precision reference."""
    x, w, b = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = F.linear(x, w, b)
    y.backward(g.double())
    return y.detach(), x.grad, w.grad, b.grad


def _training_layer(recipe, w, b, **kwargs):
    layer = lowp_torch.Linear(K, N, recipe=recipe, dtype=w.dtype, **kwargs)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    return layer


# --- the operands: bytes, and that they are what the GEMMs get ---


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


@pytest.mark.parametrize("case", ["float32_rank2", "bfloat16_rank3"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_every_gemm_operand_is_lowp_quantize_of_its_orientation(recipe, case):
    dtype, rank = case.split("_")
    x, w, _, g = _tensors(INPUT_SHAPES[rank], getattr(torch, dtype))
    x2, g2 = x.reshape(-1, K), g.reshape(-1, N)
    orientations = {
        "forward": (x2, w),
        "dgrad": (g2, w.t()),
        "wgrad": (g2.t(), x2.t()),
    }
    operands = lowp_torch.training_operands(x, w, g, recipe)
    spec_of = lowp.Recipe.from_name(recipe)
    for gemm, hp_pair in orientations.items():
        spec = getattr(spec_of, gemm)
        if spec.high_precision:
            assert operands[gemm] is None
            continue
        for q, hp, scheme in zip(operands[gemm], hp_pair, (spec.a, spec.b)):
            got, want = lowp_torch.to_lowp(q), lowp.quantize(_numpy(hp), scheme)
            where = f"{recipe} {gemm}"
            assert got.scheme == want.scheme == scheme and got.shape == want.shape, where
            assert np.array_equal(got.codes, want.codes), where
            assert got.scale.tobytes() == want.scale.tobytes(), where


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_gemms_multiply_exactly_those_operands(recipe):
    """Forward, dgrad and wgrad of the layer equal the emulated products of
    training_operands' QuantizedTensors (high-precision GEMMs: the plain matmul)."""
    x, w, b, g = _tensors(INPUT_SHAPES["rank3"])
    layer = _training_layer(recipe, w, b, kernel="emulated")
    xg = x.clone().requires_grad_()
    y = layer(xg)
    y.backward(g)
    ops = lowp_torch.training_operands(x, w, g, recipe)

    def product(gemm, hp_product, out_dtype=torch.float32, bias=None):
        if ops[gemm] is None:
            return hp_product
        return lowp_torch.scaled_matmul(
            *ops[gemm], out_dtype=out_dtype, bias=bias, kernel="emulated"
        )

    g2 = g.reshape(-1, N)
    assert torch.equal(y.reshape(-1, N), product("forward", None, bias=b))
    assert torch.equal(xg.grad.reshape(-1, K), product("dgrad", g2 @ w))
    assert torch.equal(layer.weight.grad, product("wgrad", g2.t() @ x.reshape(-1, K)))
    assert torch.equal(layer.bias.grad, g2.sum(0))


# --- fidelity: per-GEMM SQNR against high precision ---


@pytest.mark.parametrize("rank", list(INPUT_SHAPES))
@pytest.mark.parametrize("recipe", RECIPES)
def test_per_gemm_sqnr_meets_torchao_thresholds(recipe, rank):
    x, w, b, g = _tensors(INPUT_SHAPES[rank])
    y, dx, dw, db = _layer_grads(_training_layer(recipe, w, b), x, g)
    ref = _reference_grads(x, w, b, g)
    assert y.dtype == dx.dtype == dw.dtype == torch.float32 and y.shape == ref[0].shape
    thresholds = MIN_SQNR["mxfp8" if recipe.startswith("mxfp8") else "float8"]
    measured = {
        "forward": sqnr_db(y.double() - b.double(), ref[0] - b.double()),  # the GEMM alone
        "dgrad": sqnr_db(dx, ref[1]),
        "wgrad": sqnr_db(dw, ref[2]),
    }
    for gemm, db_value in measured.items():
        assert db_value >= thresholds[gemm], f"{recipe} {rank} {gemm}: {db_value:.1f} dB"
    if lowp.Recipe.from_name(recipe).wgrad.high_precision:
        assert measured["wgrad"] > 100  # a float32 GEMM
    assert sqnr_db(db, ref[3]) > 100


# --- state: none, so resume is exact ---


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32))


def _batch(step):
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(4, 8, 64, generator=gen), torch.randn(4, 8, 32, generator=gen)


def _train(model, optimizer, steps):
    losses = []
    for step in steps:
        x, target = _batch(step)
        loss = F.mse_loss(model(x), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def _converted(recipe):
    model = lowp_torch.convert_to_training(_tiny_model(), recipe)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


@pytest.mark.parametrize("recipe", RECIPES)
def test_resume_from_a_checkpoint_is_bit_identical(recipe):
    """Current scaling keeps no state: the state_dict is the float model's (no amax
    history, no buffers), a repeated call gives the same output, and a run resumed
    from step k's state_dict + optimizer state matches the uninterrupted run bit for bit."""
    model, optimizer = _converted(recipe)
    assert (
        list(model.buffers()) == []
        and model.state_dict().keys() == _tiny_model().state_dict().keys()
    )
    x, _ = _batch(0)
    assert torch.equal(model(x), model(x))
    uninterrupted = _train(model, optimizer, range(6))

    first, optimizer = _converted(recipe)
    losses_before = _train(first, optimizer, range(3))
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed, optimizer = _converted(recipe)  # fresh objects, another process in practice
    resumed.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    losses_after = _train(resumed, optimizer, range(3, 6))

    assert torch.equal(torch.cat([losses_before, losses_after]), uninterrupted)
    for name, value in model.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


# --- torch.compile, activation checkpointing, float32 weight-gradient accumulation ---


def test_compiled_forward_and_backward_match_eager():
    """fullgraph: quantizing x, w and dy, the tensorwise codes the forward keeps for
    the backward, and the three GEMMs trace as graphs. On the CPU every GEMM is the
    emulated float32 matmul in both modes, so equal results mean equal operand bytes."""
    recipe = "float8_tensorwise"
    x, w, b, g = _tensors(INPUT_SHAPES["rank3"])
    layer = _training_layer(recipe, w, b)
    y, dx, dw, db = (t.clone() for t in _layer_grads(layer, x, g))
    compiled = _layer_grads(torch.compile(layer, fullgraph=True), x, g)
    assert (
        torch.equal(compiled[0], y)
        and torch.equal(compiled[1], dx)
        and torch.equal(compiled[2], dw)
    )
    assert torch.allclose(compiled[3], db, rtol=1e-5, atol=1e-5)  # a sum, in Inductor's order


@pytest.mark.parametrize("recipe", RECIPES)
def test_activation_checkpointing_gives_the_same_gradients(recipe):
    model, _ = _converted(recipe)
    reference = copy.deepcopy(model)
    x, target = _batch(0)
    F.mse_loss(reference(x), target).backward()
    F.mse_loss(checkpoint(model, x, use_reentrant=False), target).backward()
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("recipe", ["float8_rowwise", "mxfp8_gw_hp"])
def test_float32_weight_grad_accumulation_across_micro_batches(recipe):
    """bfloat16 weights: each backward adds its float32 wgrad into weight.main_grad;
    weight.grad stays None. The sum is that of the micro-batches' float32 wgrads."""
    fp32_recipe = dataclasses.replace(
        lowp.Recipe.from_name(recipe), fp32_weight_grad_accumulation=True
    )
    model = lowp_torch.convert_to_training(_tiny_model().to(torch.bfloat16), fp32_recipe)
    layer = model[0]
    assert layer.weight.main_grad.dtype == torch.float32 and not layer.weight.main_grad.any()
    batches = [_batch(step)[0].to(torch.bfloat16) for step in range(4)]
    each = []
    for x in batches:  # one micro-batch at a time, to know each wgrad
        model(x).float().square().mean().backward()
        each.append(layer.weight.main_grad.clone())
        layer.weight.main_grad.zero_()
    for x in batches:
        model(x).float().square().mean().backward()
    expected = torch.zeros_like(each[0])
    for dw in each:
        expected += dw
    assert torch.equal(layer.weight.main_grad, expected) and layer.weight.grad is None
    assert layer.bias.grad is not None  # biases accumulate in .grad as usual
    model.to(torch.float32)  # converting the model's dtype leaves main_grad float32
    assert layer.weight.main_grad.dtype == torch.float32


def test_autocast_casts_the_input_and_keeps_the_gemms_float32():
    x, w, b, _ = _tensors(INPUT_SHAPES["rank2"])
    layer = _training_layer("float8_rowwise", w, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and torch.equal(y, layer(x.to(torch.bfloat16)))


# --- conversion, quantize_ routing, training -> inference ---


def test_convert_to_training_swaps_linears_sharing_their_parameters():
    model = _tiny_model()
    model.append(model[0])  # a layer reached twice is converted once
    weight = model[0].weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    converted = lowp_torch.convert_to_training(
        model, "mxfp8", filter_fn=lambda m, name: name != "2"
    )
    assert converted is model and type(model[2]) is nn.Linear
    assert isinstance(model[0], lowp_torch.Linear) and model[3] is model[0]
    assert model[0].weight is weight and model[0].lowering.name == "0"
    assert optimizer.param_groups[0]["params"][0] is model[0].weight
    layer = lowp_torch.convert_to_training(nn.Linear(64, 32), lowp.Recipe.from_name("mxfp8"))
    assert isinstance(layer, lowp_torch.Linear) and layer.recipe.name == "mxfp8"


def test_quantize_routes_a_recipe_object_to_training_and_a_string_to_inference():
    trained = lowp_torch.quantize_(_tiny_model(), lowp.Recipe.from_name("float8_rowwise"))
    assert isinstance(trained[0], lowp_torch.Linear) and not isinstance(
        trained[0].weight, lowp_torch.QuantizedTensor
    )
    served = lowp_torch.quantize_(_tiny_model(), "float8_rowwise")  # the inference preset
    assert type(served[0]) is nn.Linear and isinstance(served[0].weight, lowp_torch.QuantizedTensor)
    with pytest.raises(ValueError, match="fast_accum and strict configure inference"):
        lowp_torch.quantize_(_tiny_model(), lowp.Recipe.from_name("mxfp8"), strict=True)


@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8", "nvfp4"])
def test_to_inference_quantizes_the_trained_weights_as_a_fresh_quantize_does(preset):
    model, optimizer = _converted("mxfp8")
    _train(model, optimizer, range(2))
    float_model = _tiny_model()
    float_model.load_state_dict(model.state_dict())
    lowp_torch.quantize_(float_model, preset)
    served = lowp_torch.to_inference(model, preset)
    assert served is model and type(model[0]) is nn.Linear
    for name in ("0.weight", "2.weight"):
        got = lowp_torch.to_lowp(served.get_parameter(name))
        want = lowp_torch.to_lowp(float_model.get_parameter(name))
        assert np.array_equal(got.codes, want.codes) and got.scale.tobytes() == want.scale.tobytes()
        assert got.scheme == want.scheme, name
    x, _ = _batch(9)
    with torch.no_grad():
        assert torch.equal(served(x), float_model(x))


def test_to_inference_leaves_the_model_as_it_was_on_an_error():
    model = lowp_torch.convert_to_training(
        nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 40)), "float8_rowwise"
    )
    with pytest.raises(ValueError, match=r"layer '1.weight' \(in_features=64, out_features=40\)"):
        lowp_torch.to_inference(model, "float8_rowwise", kernel="scaled_mm")
    assert all(isinstance(layer, lowp_torch.Linear) for layer in model)


# --- errors name the layer and the value ---


def test_conversion_errors_name_the_layer_and_change_nothing():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 100), nn.Linear(100, 48))
    with pytest.raises(
        ValueError, match=r"^1 \(in_features=64, out_features=100\): the mxfp8 dgrad GEMM"
    ):
        lowp_torch.convert_to_training(model, "mxfp8")
    assert all(type(layer) is nn.Linear for layer in model)
    with pytest.raises(
        ValueError, match=r"^1 \(.*out_features=100\): out_features=100 is not a multiple of 16"
    ):
        lowp_torch.convert_to_training(model, "float8_rowwise", kernel="scaled_mm")
    with pytest.raises(ValueError, match="kernel must be one of"):
        lowp_torch.convert_to_training(model, "float8_tensorwise", kernel="fbgemm")
    with pytest.raises(
        ValueError, match="unknown recipe 'rowwise'.*torchao's name for 'float8_rowwise'"
    ):
        lowp_torch.convert_to_training(model, "rowwise")
    with pytest.raises(TypeError, match="expected a lowp.Recipe or a recipe name"):
        lowp_torch.convert_to_training(model, lowp.InferenceConfig.from_name("mxfp8"))
    converted = lowp_torch.convert_to_training(model, "float8_rowwise")
    with pytest.raises(TypeError, match="0 is already a lowp_torch.Linear"):
        lowp_torch.convert_to_training(converted, "float8_rowwise")
    with pytest.raises(TypeError, match="quantized for inference"):
        lowp_torch.convert_to_training(lowp_torch.quantize_(_tiny_model(), "mxfp8"), "mxfp8")


def test_input_errors_name_the_layer_before_any_gemm():
    model = lowp_torch.convert_to_training(_tiny_model(), "mxfp8")
    with pytest.raises(
        ValueError, match=r"^0: the input's last dim must be in_features=64, got shape \(5, 63\)"
    ):
        model(torch.randn(5, 63))
    with pytest.raises(
        ValueError, match=r"^0: the input has M=40 tokens .*mxfp8 wgrad GEMM, along which"
    ):
        model(torch.randn(5, 8, 64))  # MX blocks of 32 run along the tokens in the wgrad
    with torch.no_grad():  # no wgrad GEMM, so any token count will do
        assert model(torch.randn(5, 8, 64)).shape == (5, 8, 32)
    with pytest.raises(TypeError, match="float64 input is refused"):
        model(torch.randn(4, 8, 64, dtype=torch.float64))
    strict = lowp_torch.convert_to_training(_tiny_model(), "float8_rowwise", kernel="scaled_mm")
    with pytest.raises(
        ValueError,
        match=r"^0: the input has M=40 tokens .*kernel='scaled_mm' needs a multiple of 16",
    ):
        strict(torch.randn(5, 8, 64))


def test_auto_emulates_a_misaligned_gemm_and_names_its_dim(monkeypatch, caplog):
    """Pretend a GPU whose kernels could run, so only the 16-alignment rule decides:
    each GEMM's message names its own K (forward: in_features; dgrad: out_features;
    wgrad: the tokens)."""
    monkeypatch.setattr(_gemm, "kernel_problem", lambda *args: None)
    layer = lowp_torch.Linear(40, 24, recipe="float8_rowwise", name="fc")
    with caplog.at_level(logging.WARNING, logger="lowp_torch"):
        layer(torch.randn(5, 8, 40, requires_grad=True)).sum().backward()
    assert "fc forward: K=40 (in_features) is not a multiple of 16" in caplog.text
    assert "fc dgrad: K=24 (out_features) is not a multiple of 16" in caplog.text
    assert "fc wgrad: K=40 (tokens) is not a multiple of 16" in caplog.text


# --- the GPU: the fp8 kernels (run where CUDA is; the CPU run skips) ---


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: fp8 training GEMMs")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_training_sqnr_and_kernels(recipe, compiled, caplog):
    """bfloat16 on the GPU: torchao's thresholds per GEMM, and on sm_89+ the float8
    recipes' quantized GEMMs run on torch._scaled_mm (the auto choice, logged)."""
    x, w, b, g = (t.cuda() for t in _tensors((4, 256, K), torch.bfloat16))
    layer = _training_layer(recipe, w, b).cuda()
    with caplog.at_level(logging.DEBUG, logger="lowp_torch"):
        y, dx, dw, _ = _layer_grads(torch.compile(layer) if compiled else layer, x, g)
    ref = _reference_grads(x, w, b, g)
    thresholds = MIN_SQNR["mxfp8" if recipe.startswith("mxfp8") else "float8"]
    assert y.dtype == dx.dtype == dw.dtype == torch.bfloat16
    assert sqnr_db(y.double() - b.double(), ref[0] - b.double()) >= thresholds["forward"]
    assert sqnr_db(dx, ref[1]) >= thresholds["dgrad"]
    assert sqnr_db(dw, ref[2]) >= thresholds["wgrad"]
    if (
        not compiled
        and recipe.startswith("float8")
        and torch.cuda.get_device_capability() >= (8, 9)
    ):
        spec = lowp.Recipe.from_name(recipe)
        for gemm in ("forward", "dgrad", "wgrad"):
            if not getattr(spec, gemm).high_precision:
                assert f"linear {gemm}: kernel='scaled_mm'" in caplog.text, caplog.text
