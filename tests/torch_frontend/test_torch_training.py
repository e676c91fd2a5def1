"""Low-precision training in PyTorch (spec §8): lowp_torch.Linear, convert_to_training,
quantize_ with a Recipe, to_inference.

- every GEMM operand has the bytes `lowp.quantize` gives the right orientation of the
  high-precision tensor, and the autograd Function multiplies exactly those operands;
- per-GEMM SQNR against high precision at torchao's thresholds, rank-2 and rank-3;
- exact resume, torch.compile, activation checkpointing, float32 weight-gradient
  accumulation, training -> inference, and errors that name the layer;
- on the Triton casts (under Triton's CPU interpreter, in a subprocess: see
  test_triton_casts.py), the layer quantizes x, w and dy both ways from one read
  (`quantize_both`) exactly where their two schemes are the same, keeps fp8 codes for
  the backward, and trains to the very bytes of the torch-ops path.
"""

import copy
import dataclasses
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import unittest.mock

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import lowp
import lowp_torch
from lowp import extend
from lowp_torch import _cast_kernels, _gemm, _log, _training

RECIPES = lowp.Recipe.names()
K, N = 128, 96
INPUT_SHAPES = {"rank2": (64, K), "rank3": (3, 32, K)}
# torchao's training thresholds (float8: test/float8/test_base.py; mx: test/prototype/mx_formats;
# nvfp4: the forward's 15 dB of torchao's NVFP4 linear test,
# test/prototype/moe_training/nvfp4_training/test_nvfp4_linear.py, which asserts only finite
# gradients, so the gradients take test_mx_linear.py's fp4 floors, input grad 8, weight grad
# 10; Transformer Engine's NVFP4 tests compare to its reference implementation, no SQNR).
MIN_SQNR = {
    "float8": {"forward": 18.0, "dgrad": 18.0, "wgrad": 17.0},
    "mxfp8": {"forward": 27.0, "dgrad": 25.0, "wgrad": 24.0},
    "nvfp4": {"forward": 15.0, "dgrad": 8.0, "wgrad": 10.0},
}


def _floors(recipe: str) -> dict:
    return MIN_SQNR[recipe.split("_")[0]]


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
    """A Linear holding w and b that always runs the recipe: these tests are about its
    GEMMs, and on a GPU the default small-shape policy would run their small shapes in
    high precision (the policy has its own tests, below)."""
    kwargs.setdefault("small_shapes", "quantize")
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
    plan = extend.LinearPlan.of(lowp.Recipe.from_name(recipe))
    for gemm, hp_pair in orientations.items():
        gemm_plan = getattr(plan, gemm)
        if gemm_plan is None:
            assert operands[gemm] is None
            continue
        for q, hp, op in zip(operands[gemm], hp_pair, (gemm_plan.a, gemm_plan.b), strict=True):
            # lowp.quantize of the orientation (after the recipe's Hadamard transform,
            # with its stochastic rounding, where it has them)
            got, want = lowp_torch.to_lowp(q), op.quantize_reference(_numpy(hp))
            where = f"{recipe} {gemm}"
            assert got.scheme == want.scheme == op.scheme and got.shape == want.shape, where
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
    thresholds = _floors(recipe)
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("recipe", lowp.Recipe.names())
def test_compiled_before_any_eager_call_traces_whole(recipe, monkeypatch):
    """A layer compiled (fullgraph) before anything of lowp ran eagerly in the process
    traces its forward and backward whole, with the eager step's results. What broke it:
    first-use writes inside the traced autograd.Function (the thread's cast-kernel modes,
    the plan's cached properties, Python 3.11's cached_property lock) and the crc32 of
    NVFP4's Hadamard signs, which Dynamo cannot trace."""
    from lowp_torch import _cast_kernels

    monkeypatch.delattr(_cast_kernels._THREAD, "modes", raising=False)  # a fresh thread's
    torch._dynamo.reset()  # Linear.forward compiled by earlier tests: stay under the limit
    x, w, b, g = _tensors(INPUT_SHAPES["rank2"], torch.bfloat16)
    layer = _training_layer(recipe, w, b)
    step = torch.compile(layer, fullgraph=True, backend="aot_eager")
    # a second token count: Dynamo recompiles it with M symbolic (automatic dynamic)
    for rows in (x.shape[0], x.shape[0] - 32):  # multiples of every recipe's block along M
        compiled = [t.clone() for t in _layer_grads(step, x[:rows], g[:rows])]
        eager = _layer_grads(layer, x[:rows], g[:rows])
        for name, c, e in zip(("y", "dx", "dw", "db"), compiled, eager, strict=True):
            assert torch.equal(c, e), f"{recipe}, {rows} rows: compiled {name} differs from eager"


@pytest.mark.parametrize("recipe", RECIPES)
def test_activation_checkpointing_gives_the_same_gradients(recipe):
    model, _ = _converted(recipe)
    reference = copy.deepcopy(model)
    x, target = _batch(0)
    F.mse_loss(reference(x), target).backward()
    F.mse_loss(checkpoint(model, x, use_reentrant=False), target).backward()
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
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


def test_quantize_takes_inference_configs_and_refuses_a_recipe_naming_convert_to_training():
    served = lowp_torch.quantize_(_tiny_model(), "float8_rowwise")  # the inference preset
    assert type(served[0]) is nn.Linear and isinstance(served[0].weight, lowp_torch.QuantizedTensor)
    model = _tiny_model()
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TypeError, match=r"convert_to_training\(model, 'float8_rowwise'\)"):
        lowp_torch.quantize_(model, lowp.Recipe.from_name("float8_rowwise"))
    assert type(model[0]) is nn.Linear and not isinstance(
        model[0].weight, lowp_torch.QuantizedTensor
    )
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))
    with pytest.raises(TypeError, match="small_shapes"):
        lowp_torch.quantize_(_tiny_model(), "float8_rowwise", small_shapes="quantize")


def test_convert_to_training_takes_the_small_shape_policy():
    recipe = lowp.Recipe.from_name("float8_rowwise")
    assert lowp_torch.convert_to_training(_tiny_model(), recipe)[0].lowering.small_shapes == "auto"
    forced = lowp_torch.convert_to_training(_tiny_model(), recipe, small_shapes="quantize")
    assert all(m.lowering.small_shapes == "quantize" for m in forced if hasattr(m, "lowering"))
    with pytest.raises(ValueError, match=r"small_shapes must be one of \('auto', 'quantize'\)"):
        lowp_torch.convert_to_training(_tiny_model(), recipe, small_shapes="never")


@pytest.mark.parametrize(
    "recipe, preset",
    [
        ("mxfp8", "float8_rowwise"),
        ("mxfp8", "mxfp8"),
        ("mxfp8", "nvfp4"),
        ("float8_blockwise", "float8_block"),
        ("float8_blockwise_ue8m0", "float8_block"),
        ("nvfp4", "nvfp4"),
    ],
)
def test_to_inference_quantizes_the_trained_weights_as_a_fresh_quantize_does(recipe, preset):
    model, optimizer = _converted(recipe)
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
        ValueError, match=r"^0: the input has M=40 tokens .*mxfp8 wgrad GEMM cannot quantize g\.T"
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


# --- the Triton casts: both orientations from one read (`quantize_both`) ---

HAS_TRITON = importlib.util.find_spec("triton") is not None
E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
ROWWISE = lowp.AxisScaling(E4M3, pow2=True)
MX = lowp.MXScaling(E4M3, mode="rceil")
# Recipes whose operands' two schemes differ in one field each, where quantize_both
# must not run for that tensor: x (forward.a, wgrad.b), w (forward.b, dgrad.b), dy
# (dgrad.a, wgrad.a).
MISMATCHED = {
    # x: pow2 only; w: AxisScaling against MXScaling; dy: element format only.
    "axis_mismatched": lowp.Recipe(
        name="axis_mismatched",
        forward=lowp.GemmSpec(ROWWISE, ROWWISE),
        dgrad=lowp.GemmSpec(dataclasses.replace(ROWWISE, fmt=E5M2), MX),
        wgrad=lowp.GemmSpec(ROWWISE, dataclasses.replace(ROWWISE, pow2=False)),
    ),
    # x: MX mode only; w and dy (e5m2) match.
    "mx_mode_mismatched": lowp.Recipe(
        name="mx_mode_mismatched",
        forward=lowp.GemmSpec(MX, MX),
        dgrad=lowp.GemmSpec(dataclasses.replace(MX, fmt=E5M2), MX),
        wgrad=lowp.GemmSpec(
            dataclasses.replace(MX, fmt=E5M2), dataclasses.replace(MX, mode="floor")
        ),
    ),
}
# The tensors quantized both ways in one training step where every GEMM runs, read
# off spec §8's table: the same AxisScaling/MXScaling scheme in both of a tensor's GEMMs.
BOTH_WAYS = {
    # tensorwise reuses its forward codes (`reuses_codes`): written transposed too
    "float8_tensorwise": {"x", "w", "dy"},
    "float8_rowwise": {"x", "w", "dy"},
    "float8_rowwise_gw_hp": set(),  # dgrad's w is tensorwise; no wgrad GEMM
    "mxfp8": {"x", "w", "dy"},
    "mxfp8_gw_hp": {"w"},  # no wgrad GEMM: x and dy are needed in high precision
    "axis_mismatched": set(),
    "mx_mode_mismatched": {"w", "dy"},
    "float8_blockwise": set(),  # BlockScaling: no quantize_both; tiles of any orientation
    "float8_blockwise_ue8m0": set(),
}
# (recipe, variant): "step" (bfloat16, rank 3, every GEMM), "float32" (rank 2), and
# steps where a GEMM does not run, so its codes must not be made: "frozen_weight" (no
# wgrad), "input_without_grad" (no dgrad) and "no_grad" (a forward alone).
STEP_SHAPE = (2, 32, K)  # M = 64: the MX block divides it, and no two of x, w, dy share a shape
INTERPRETED = [(r, "step") for r in BOTH_WAYS]
INTERPRETED += [("float8_rowwise", v) for v in ("float32", "frozen_weight", "input_without_grad")]
INTERPRETED += [
    ("float8_tensorwise", v) for v in ("frozen_weight", "input_without_grad", "no_grad")
]
INTERPRETED += [("mxfp8", v) for v in ("float32", "no_grad")]


def _recipe_named(name):
    return MISMATCHED.get(name) or lowp.Recipe.from_name(name)


def _expected_both_ways(recipe: str, variant: str) -> set:
    wanted = set(BOTH_WAYS[recipe])
    if variant == "frozen_weight":  # no wgrad: x's and dy's columns are of no use
        wanted -= {"x", "dy"}
    if variant == "input_without_grad":  # no dgrad: w's columns are of no use, dy needs none
        wanted -= {"w", "dy"}
    if variant == "no_grad":
        wanted = set()
    return wanted


WRITTEN_TRANSPOSED = " (codes written transposed)"


def _describe_saved(t) -> str:
    """A saved tensor as the tests compare it: its scheme if codes (and whether they were
    written transposed, K-major for the backward GEMM: `quantize_both`'s second result),
    else 'high precision'."""
    if isinstance(t, lowp_torch.QuantizedTensor):
        codes = t.codes
        transposed = codes.dim() == 2 and codes.t().is_contiguous() and not codes.is_contiguous()
        return repr(t.scheme) + (WRITTEN_TRANSPOSED if transposed else "")
    return "high precision"


def _expected_saved(recipe: str, variant: str, both=None) -> list[str]:
    """[x, w] as the forward saves them: the codes along the first axis, written
    transposed, where quantized both ways (`both`: the tensors quantize_both made, by
    default those of the Triton casts); else the forward's codes under tensorwise scaling
    and square tiles (the same tiles transposed); else high precision."""
    spec = _recipe_named(recipe)
    both = _expected_both_ways(recipe, variant) if both is None else both
    out = []
    for name, scheme in (("x", spec.forward.a), ("w", spec.forward.b)):
        square_tiles = isinstance(scheme, lowp.BlockScaling) and len(set(scheme.block)) == 1
        if name in both:
            out.append(repr(scheme.permuted((1, 0))) + WRITTEN_TRANSPOSED)
        elif isinstance(scheme, lowp.TensorScaling) or square_tiles:  # the plan reuses them
            out.append(repr(scheme))
        else:
            out.append("high precision")
    return out


def _step_on_both_paths(recipe: str, variant: str, device: str = "cpu") -> dict:
    """One training step of lowp_torch.Linear under cast_kernels("triton") and under
    cast_kernels("torch"), and training_operands under both: every difference, which
    tensors quantize_both quantized, and what the forward saved."""
    from lowp_torch import _triton_casts

    shape = (64, K) if variant == "float32" else STEP_SHAPE
    dtype = torch.float32 if variant == "float32" else torch.bfloat16
    x, w, b, g = (t.to(device) for t in _tensors(shape, dtype, seed=3))
    names = {(64, K): "x", (N, K): "w", (64, N): "dy"}
    both_ways = []
    quantize_both = _triton_casts.quantize_both

    def counted(t, scheme):
        both_ways.append(names[tuple(t.shape)])
        return quantize_both(t, scheme)

    results, saved, both_ways_of = {}, {}, {}
    with unittest.mock.patch.object(_triton_casts, "quantize_both", counted):
        for mode in ("torch", "triton"):
            both_ways.clear()
            layer = _training_layer(_recipe_named(recipe), w, b).to(device)
            layer.weight.requires_grad_(variant != "frozen_weight")
            xg = x.clone().requires_grad_(variant != "input_without_grad")
            with lowp_torch.cast_kernels(mode), torch.set_grad_enabled(variant != "no_grad"):
                y = layer(xg)
                if y.grad_fn is not None:
                    saved[mode] = [_describe_saved(t) for t in y.grad_fn.saved_tensors]
                    y.backward(g)
            results[mode] = {"y": y.detach(), "dx": xg.grad, "dw": layer.weight.grad}
            results[mode]["db"] = layer.bias.grad
            both_ways_of[mode] = sorted(both_ways)
            if variant == "step":
                with lowp_torch.cast_kernels(mode):
                    results[mode]["operands"] = lowp_torch.training_operands(
                        x, w, g, _recipe_named(recipe)
                    )
    differences = []
    for key, want in results["torch"].items():
        got = results["triton"][key]
        if key == "operands":
            differences += _operand_differences(got, want)
        elif (got is None) != (want is None) or (want is not None and not torch.equal(got, want)):
            differences.append(f"{key} differs")
    return {
        "differences": differences,
        "both_ways": both_ways_of,  # the layer's step (training_operands run later)
        "saved": saved,
    }


def _operand_differences(got: dict, want: dict) -> list[str]:
    out = []
    for gemm, pair in want.items():
        if pair is None or got[gemm] is None:
            if (pair is None) != (got[gemm] is None):
                out.append(f"{gemm}: high precision on one path only")
            continue
        for role, q, r in zip("ab", got[gemm], pair, strict=True):
            q, r = lowp_torch.to_lowp(q), lowp_torch.to_lowp(r)
            if not (
                q.scheme == r.scheme
                and q.shape == r.shape
                and q.codes.tobytes() == r.codes.tobytes()
                and q.scale.tobytes() == r.scale.tobytes()
            ):
                out.append(f"training_operands {gemm} {role} differs")
    return out


def _interpreter_main():
    """The subprocess: run INTERPRETED, print {case id: result} as JSON."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    torch.set_num_threads(1)
    results = {}
    for recipe, variant in INTERPRETED:
        try:
            results[f"{recipe}-{variant}"] = _step_on_both_paths(recipe, variant)
        except Exception as e:  # noqa: BLE001 - reported per case, the others still run
            results[f"{recipe}-{variant}"] = {"error": repr(e)}
    print(json.dumps(results))


@pytest.fixture(scope="module")
def interpreted_steps():
    """{case id: result} from one interpreter subprocess (TRITON_INTERPRET is read when
    a kernel is defined, so it cannot be switched on inside this process)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # a failure is reported with its stderr, below
    )
    if run.returncode != 0:
        pytest.fail(f"the interpreter run failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("recipe, variant", INTERPRETED, ids=[f"{r}-{v}" for r, v in INTERPRETED])
def test_triton_casts_quantize_both_ways_at_once_and_train_to_the_same_bytes(
    interpreted_steps, recipe, variant
):
    _check_step(interpreted_steps[f"{recipe}-{variant}"], recipe, variant)


@pytest.mark.skipif(not (torch.cuda.is_available() and HAS_TRITON), reason="needs CUDA and triton")
@pytest.mark.parametrize("recipe, variant", INTERPRETED, ids=[f"{r}-{v}" for r, v in INTERPRETED])
def test_cuda_triton_casts_quantize_both_ways_at_once_and_train_to_the_same_bytes(recipe, variant):
    _check_step(_step_on_both_paths(recipe, variant, "cuda"), recipe, variant)


def _check_step(result: dict, recipe: str, variant: str):
    """y, dx, dw, db (and training_operands' bytes) on the Triton casts equal the
    torch-ops path's; quantize_both ran for exactly the tensors whose two schemes are
    the same TensorScaling/AxisScaling/MXScaling and whose later GEMM runs; the forward
    saved those codes (fp8, along the first axis) instead of the high-precision x or w."""
    assert "error" not in result, result.get("error")
    assert not result["differences"], result["differences"]
    assert result["both_ways"]["torch"] == []
    triton = result["both_ways"]["triton"]
    assert set(triton) == _expected_both_ways(recipe, variant)
    assert len(triton) == len(set(triton))  # each tensor once
    if variant == "no_grad":
        assert result["saved"] == {}
    else:
        assert result["saved"]["triton"] == _expected_saved(recipe, variant)
        # On the torch ops nothing is quantized both ways.
        assert result["saved"]["torch"] == _expected_saved(recipe, variant, both=set())


@pytest.mark.parametrize(
    "scheme, later, one_read",
    [
        (ROWWISE, ROWWISE, True),
        (MX, MX, True),
        (ROWWISE, dataclasses.replace(ROWWISE, pow2=False), False),
        (ROWWISE, dataclasses.replace(ROWWISE, fmt=E5M2), False),
        (MX, dataclasses.replace(MX, mode="floor"), False),
        (MX, dataclasses.replace(MX, block=16), False),
        (ROWWISE, MX, False),
        (ROWWISE, None, False),  # the later GEMM runs in high precision
        (lowp.TensorScaling(), lowp.TensorScaling(), True),  # its codes, written transposed
        (lowp.TensorScaling(), lowp.TensorScaling(pow2=True), False),
        (lowp.BlockScaling(block=(8, 8)), lowp.BlockScaling(block=(8, 8)), False),  # no kernel
        (lowp.MXScaling("float4_e2m1fn"), lowp.MXScaling("float4_e2m1fn"), False),
    ],
)
def test_one_read_only_where_both_schemes_are_the_same(monkeypatch, scheme, later, one_read):
    """Whatever the cast path, quantize_both's second result serves only a later
    TensorScaling/AxisScaling/MXScaling scheme equal to the first (its codes along t's
    first axis are then `_transposed`'s); and only where `use_triton` says the casts
    run."""
    t = torch.ones(64, 64)
    operand = None if later is None else extend.OperandPlan("x", True, later, earlier=scheme)
    monkeypatch.setattr(_cast_kernels, "use_triton", lambda *args, **kwargs: True)
    assert _training._one_read(t, operand, "t") is one_read
    monkeypatch.setattr(_cast_kernels, "use_triton", lambda *args, **kwargs: False)
    assert _training._one_read(t, operand, "t") is False


@pytest.mark.parametrize("recipe", ["float8_rowwise", "mxfp8"])
def test_off_the_triton_casts_the_forward_saves_the_high_precision_tensors(recipe):
    x, w, b, _ = _tensors(STEP_SHAPE)
    y = _training_layer(recipe, w, b)(x.requires_grad_())
    assert [_describe_saved(t) for t in y.grad_fn.saved_tensors] == ["high precision"] * 2


# --- the GPU: the fp8 kernels (run where CUDA is; the CPU run skips) ---


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: fp8 training GEMMs")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_training_sqnr_and_kernels(recipe, compiled, caplog):
    """bfloat16 on the GPU: torchao's thresholds per GEMM, and on sm_89+ the float8
    recipes' quantized GEMMs run on torch._scaled_mm (the auto choice, logged)."""
    x, w, b, g = (t.cuda() for t in _tensors((4, 256, K), torch.bfloat16))
    layer = _training_layer(recipe, w, b).cuda()
    torch._dynamo.reset()  # past the recompile limit, compile would fall back to eager
    with caplog.at_level(logging.DEBUG, logger="lowp_torch"):
        y, dx, dw, _ = _layer_grads(torch.compile(layer) if compiled else layer, x, g)
    ref = _reference_grads(x, w, b, g)
    thresholds = _floors(recipe)
    assert y.dtype == dx.dtype == dw.dtype == torch.bfloat16
    assert sqnr_db(y.double() - b.double(), ref[0] - b.double()) >= thresholds["forward"]
    assert sqnr_db(dx, ref[1]) >= thresholds["dgrad"]
    assert sqnr_db(dw, ref[2]) >= thresholds["wgrad"]
    if (
        not compiled
        and recipe.startswith("float8")
        and "blockwise" not in recipe  # K = 128: one block scale a row, see below
        and torch.cuda.get_device_capability() >= (8, 9)
    ):
        spec = lowp.Recipe.from_name(recipe)
        for gemm in ("forward", "dgrad", "wgrad"):
            if not getattr(spec, gemm).high_precision:
                assert f"linear {gemm}: kernel='scaled_mm'" in caplog.text, caplog.text


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU: torch._scaled_mm's 1x128/128x128 block-scaled forms",
)
@pytest.mark.parametrize("recipe", ["float8_blockwise", "float8_blockwise_ue8m0"])
def test_blockwise_gemms_run_on_scaled_mm_on_sm90(recipe, caplog):
    """All three GEMMs of the blockwise recipes take cuBLAS's block-scaled GEMM where
    the block-scale counts suit it (M and each ceil(dim/128) multiples of 4), and give
    the emulation's SQNR; the operands are the CPU's bytes (training_operands)."""
    k = n = 512
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1024, k, generator=gen).to(torch.bfloat16).cuda()
    w = (torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16).cuda()
    g = torch.randn(1024, n, generator=gen).to(torch.bfloat16).cuda()
    layer = lowp_torch.Linear(k, n, bias=False, recipe=recipe, dtype=torch.bfloat16)
    layer = layer.cuda()
    with torch.no_grad():
        layer.weight.copy_(w)
    with caplog.at_level(logging.DEBUG, logger="lowp_torch"):
        xg = x.clone().requires_grad_()
        y = layer(xg)
        y.backward(g)
    for gemm in ("forward", "dgrad", "wgrad"):
        assert f"linear {gemm}: kernel='scaled_mm'" in caplog.text, caplog.text
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    yr = F.linear(xd, wd)
    yr.backward(g.double())
    thresholds = MIN_SQNR["float8"]
    assert sqnr_db(y, yr) >= thresholds["forward"]
    assert sqnr_db(xg.grad, xd.grad) >= thresholds["dgrad"]
    assert sqnr_db(layer.weight.grad, wd.grad) >= thresholds["wgrad"]
    on_gpu = lowp_torch.training_operands(x, w, g, recipe)
    on_cpu = lowp_torch.training_operands(x.cpu(), w.cpu(), g.cpu(), recipe)
    for gemm in ("forward", "dgrad", "wgrad"):
        for q_gpu, q_cpu in zip(on_gpu[gemm], on_cpu[gemm], strict=True):
            got, want = lowp_torch.to_lowp(q_gpu), lowp_torch.to_lowp(q_cpu)
            assert np.array_equal(got.codes, want.codes), gemm
            assert got.scale.tobytes() == want.scale.tobytes(), gemm


if __name__ == "__main__":
    _interpreter_main()


# --- the small-shape policy (lowp._small_shapes) ----------------------------------------


@pytest.fixture
def fp8_kernels_here(monkeypatch, scaled_small_shape_costs):
    """Make this CPU look like a GPU with fp8 kernels to the policy, with its costs
    scaled down so that CPU-sized calls fall on both sides: a 64 x 32 layer pays from 32
    tokens on (traced under torch.compile: from 18), a 16 -> 32 layer never (the root
    conftest's fixture)."""
    monkeypatch.setattr(_training, "fp8_kernels_run", lambda recipe, device, lowering: True)
    monkeypatch.setattr(_log, "_said", set())  # each test sees its own "once" messages


def _float_twin(layer):
    twin = nn.Linear(layer.in_features, layer.out_features)
    twin.load_state_dict(layer.state_dict())
    return twin


@pytest.mark.parametrize("recipe", ["float8_tensorwise", "float8_rowwise", "mxfp8"])
def test_small_calls_run_the_float_layer_and_large_ones_the_recipe(
    recipe, fp8_kernels_here, caplog
):
    torch.manual_seed(0)
    layer = lowp_torch.Linear(64, 32, recipe=recipe, name="fc")
    twin = _float_twin(layer)
    quantized = unittest.mock.patch.object(
        _training._LinearFunction, "apply", wraps=_training._LinearFunction.apply
    )
    for tokens, expect_quantized in ((8, False), (31, False), (32, True), (96, True)):
        x = torch.randn(tokens, 64, requires_grad=True)
        x_twin = x.detach().clone().requires_grad_()
        layer.zero_grad()
        twin.zero_grad()
        with quantized as spy, caplog.at_level(logging.INFO, logger="lowp_torch"):
            y = layer(x)
            y.square().sum().backward()
        assert spy.called == expect_quantized, tokens
        y_twin = twin(x_twin)
        y_twin.square().sum().backward()
        if expect_quantized:
            assert not torch.equal(y, y_twin)  # the recipe's numerics, not the float layer's
        else:  # the float layer's call, bit for bit
            assert torch.equal(y, y_twin)
            assert torch.equal(x.grad, x_twin.grad)
            assert torch.equal(layer.weight.grad, twin.weight.grad)
            assert torch.equal(layer.bias.grad, twin.bias.grad)
    said = [r.getMessage() for r in caplog.records if "runs in high precision" in r.getMessage()]
    # Once per layer and reason, whatever M: the first small call's numbers.
    assert len(said) == 1 and said[0].startswith(f"fc: {recipe} "), said
    assert "M*K*N = 8*64*32: predicted 1.000 ms in fp8 against 0.269 ms" in said[0]


@pytest.mark.slow
def test_a_compiled_call_is_decided_without_eager_host_time(fp8_kernels_here):
    """Under torch.compile a call has no host time of its own: the policy predicts its
    device time alone, so 24 tokens through a 64 -> 32 layer run the recipe compiled
    (fp8 pays from 18 tokens traced) and the float layer eager (from 32); 8 tokens run
    the float layer both ways."""
    torch.manual_seed(0)
    layer = lowp_torch.Linear(64, 32, recipe="float8_rowwise", name="fc")
    twin = _float_twin(layer)
    forced = lowp_torch.Linear.from_float(twin, "float8_rowwise", small_shapes="quantize")
    x, small = torch.randn(24, 64), torch.randn(8, 64)
    assert torch.equal(layer(x), twin(x))  # eager: the float layer's call
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="eager", fullgraph=True, dynamic=False)
    y = compiled(x)
    assert not torch.equal(y, twin(x)) and torch.equal(y, forced(x))  # the recipe's
    assert torch.equal(compiled(small), twin(small))


def test_small_shapes_report_says_what_each_layer_runs_eager_and_compiled(fp8_kernels_here):
    """At 24 tokens the 64 -> 32 layer runs high precision eager (fp8 pays from 32) and
    fp8 compiled (from 18), with the predicted times of each; the 32 -> 16 layer never
    pays; a layer forced to quantize says so."""
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.Linear(16, 8))
    lowp_torch.convert_to_training(model, "float8_rowwise", lambda m, name: name != "3")
    model[3] = lowp_torch.Linear.from_float(model[3], "float8_rowwise", small_shapes="quantize")
    eager = lowp_torch.small_shapes_report(model, 24).splitlines()
    compiled = lowp_torch.small_shapes_report(model, 24, compiled=True).splitlines()
    assert eager[0].startswith("small_shapes at 24 tokens a call, eager (with host time)")
    assert compiled[0].startswith("small_shapes at 24 tokens a call, compiled (device time)")
    assert eager[1].split() == ["layer", "K", "->", "N", "recipe", "fp8", "ms"] + [
        "high-precision",
        "ms",
        "runs",
    ]
    row = "0  64 -> 32  float8_rowwise  {}  0.808  {}"
    assert " ".join(eager[2].split()) == " ".join(row.format("1.000", "high precision").split())
    assert " ".join(compiled[2].split()) == " ".join(row.format("0.653", "fp8").split())
    for report in (eager, compiled):
        assert report[3].split()[:4] == ["2", "32", "->", "16"]
        assert report[3].endswith("high precision")
        assert report[4].endswith("fp8 (small_shapes='quantize')")
    assert len(eager) == len(compiled) == 5
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=f"tokens must be a positive int, got {bad!r}"):
            lowp_torch.small_shapes_report(model, bad)
    with pytest.raises(ValueError, match="Sequential has no lowp_torch.Linear"):
        lowp_torch.small_shapes_report(nn.Sequential(nn.Linear(4, 4)), 8)


def test_a_layer_remembers_its_small_shape_decision_per_shape_and_device(
    fp8_kernels_here, monkeypatch
):
    """The policy runs once per input shape and device, its answer reused after, in a
    store of bounded size; a remembered fallback is the float layer's F.linear itself."""
    from lowp_torch import _training_linear

    layer = lowp_torch.Linear(64, 32, recipe="float8_rowwise")
    asked = unittest.mock.patch.object(
        _training, "in_high_precision", wraps=_training.in_high_precision
    )
    quantized = unittest.mock.patch.object(
        _training._LinearFunction, "apply", wraps=_training._LinearFunction.apply
    )
    plain = unittest.mock.patch.object(_training_linear.F, "linear", wraps=F.linear)
    with asked as policy, quantized as spy, plain as linear:
        for shape, expect_quantized in (
            ((8, 64), False),
            ((2, 4, 64), False),
            ((96, 64), True),
            ((8, 64), False),
            ((96, 64), True),
        ):
            spy.reset_mock()
            linear.reset_mock()
            layer(torch.randn(shape, requires_grad=True)).sum().backward()
            assert spy.called == expect_quantized, shape
            assert linear.called != expect_quantized, shape
    asks = [c.args[0].shape for c in policy.call_args_list]
    assert asks == [(8, 64), (2, 4, 64), (96, 64)], asks
    cpu = torch.device("cpu")
    assert layer._decided == {  # the device type where it falls back, "" where not
        ((8, 64), cpu): "cpu",
        ((2, 4, 64), cpu): "cpu",
        ((96, 64), cpu): "",
    }
    with pytest.raises(ValueError, match=r"last dim must be in_features=64, got shape \(8, 32\)"):
        layer(torch.randn(8, 32))  # checked before anything is remembered
    monkeypatch.setattr(_training_linear, "_DECISIONS_KEPT", 3)
    layer(torch.randn(16, 64)).sum().backward()  # a fourth shape: the store starts over
    assert layer._decided == {((16, 64), cpu): "cpu"}


def test_the_remembered_fallback_reads_a_parametrized_weight_and_follows_dtype_and_autocast(
    fp8_kernels_here,
):
    """The fallback's fast path equals the float layer's call for a weight registered
    as a parametrization (a property, not in `_parameters`), and leaves F.linear where
    its conditions no longer hold: a weight moved to another dtype, autocast."""
    from torch.nn.utils import parametrize

    class Doubled(nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(0)
    float_layer = nn.Linear(64, 32)
    layer = lowp_torch.convert_to_training(copy.deepcopy(float_layer), "float8_rowwise")
    parametrize.register_parametrization(layer, "weight", Doubled())
    parametrize.register_parametrization(float_layer, "weight", Doubled())
    x = torch.randn(8, 64)
    for _ in range(2):  # decided, then remembered
        assert torch.equal(layer(x), float_layer(x))
    layer.to(torch.bfloat16)  # the weight's dtype now differs from x's
    want = float_layer.to(torch.bfloat16)(x.bfloat16()).float()
    got = layer(x)  # x stays float32: the high-precision function, x's dtype out
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_small_shapes_quantize_always_runs_the_recipe(fp8_kernels_here):
    layer = lowp_torch.Linear(64, 32, recipe="float8_rowwise", small_shapes="quantize")
    with unittest.mock.patch.object(
        _training._LinearFunction, "apply", wraps=_training._LinearFunction.apply
    ) as spy:
        layer(torch.randn(2, 64)).sum().backward()
    assert spy.called
    assert "small_shapes='quantize'" in repr(layer)


def test_a_layer_too_small_to_pay_says_so_when_built_and_never_quantizes(fp8_kernels_here, caplog):
    with caplog.at_level(logging.INFO, logger="lowp_torch"):
        model = lowp_torch.convert_to_training(nn.Sequential(nn.Linear(16, 32)), "float8_rowwise")
    assert any(
        "0: where fp8 GEMM kernels run, it trains in high precision "
        "(M*K*N = 64*16*32 (the most tokens expected), traced: predicted 0.538 ms in fp8 "
        "against 0.539 ms in high precision; fp8 runs where predicted at least 5% faster)"
        in r.getMessage()
        for r in caplog.records
    )
    with unittest.mock.patch.object(_training._LinearFunction, "apply", side_effect=AssertionError):
        model(torch.randn(4096, 16)).sum().backward()  # 2**21 MACs, but the layer never pays


def test_the_high_precision_call_accumulates_main_grad_in_float32(fp8_kernels_here):
    recipe = dataclasses.replace(
        lowp.Recipe.from_name("float8_rowwise"), fp32_weight_grad_accumulation=True
    )
    torch.manual_seed(1)
    layer = lowp_torch.Linear(64, 32, recipe=recipe, dtype=torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # two micro-batches add up in main_grad
        layer(x).float().square().sum().backward()
    assert layer.weight.grad is None and layer.weight.main_grad.dtype == torch.float32
    y = F.linear(x.detach().double(), layer.weight.detach().double(), layer.bias.detach().double())
    g = 2 * y.bfloat16().double()  # the cotangent the bf16 output passes back
    expected = 2 * (g.t() @ x.detach().double())
    assert torch.allclose(layer.weight.main_grad.double(), expected, rtol=1e-5, atol=1e-4)
    assert x.grad.dtype == torch.bfloat16


def test_fp8_kernels_run_only_where_the_recipe_gets_real_kernels(monkeypatch):
    cuda = torch.device("cuda", 0)
    lowering = _training.Lowering()
    fp8, mx = lowp.Recipe.from_name("float8_rowwise"), lowp.Recipe.from_name("mxfp8")
    assert not _training.fp8_kernels_run(fp8, torch.device("cpu"), lowering)
    for capability, want_fp8, want_mx in (
        ((8, 0), False, False),
        ((8, 9), True, False),
        ((9, 0), True, False),
        ((10, 0), True, True),
    ):
        monkeypatch.setattr(_gemm, "_cuda_capability", lambda index, c=capability: c)
        assert _training.fp8_kernels_run(fp8, cuda, lowering) == want_fp8, capability
        assert _training.fp8_kernels_run(mx, cuda, lowering) == want_mx, capability
    assert not _training.fp8_kernels_run(fp8, cuda, _training.Lowering(kernel="emulated"))


def test_small_shapes_must_be_auto_or_quantize():
    with pytest.raises(
        ValueError, match=r"fc: small_shapes must be one of \('auto', 'quantize'\), got 'off'"
    ):
        lowp_torch.Linear(64, 32, recipe="float8_rowwise", name="fc", small_shapes="off")


def test_the_high_precision_call_keeps_a_float32_weight_gradient_in_float32(fp8_kernels_here):
    """bfloat16 input, float32 weight, no autocast: the fallback's dw is accumulated in
    float32 and rounded once to the weight's dtype, as the recipes' wgrad is (and
    lowp_jax's fallback), not rounded to bfloat16 through `weight.to(bfloat16)`."""
    torch.manual_seed(3)
    layer = lowp_torch.Linear(64, 32, recipe="float8_rowwise")
    x = torch.randn(8, 64, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (8, 32)
    y.float().sum().backward()
    dw = layer.weight.grad
    assert dw.dtype == torch.float32
    assert not torch.equal(dw.bfloat16().float(), dw)
    expected = torch.ones(8, 32, dtype=torch.float64).t() @ x.double()
    torch.testing.assert_close(dw.double(), expected, rtol=1e-6, atol=0)
