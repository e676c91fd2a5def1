"""lowp_torch.Linear under DTensor tensor parallelism (lowp_torch._tensor_parallel), on
two and four CPU processes talking gloo: each rank's GEMMs get the unsharded layer's bytes, and a
split that would cut a quantization group is refused."""

import dataclasses
import re

import pytest
import torch
from test_fsdp import spawn
from torch import nn

import lowp
import lowp_torch
from lowp import extend
from lowp_torch import _tensor_parallel

K, N, M = 128, 128, 32


def _layer_and_data():
    torch.manual_seed(0)
    layer = lowp_torch.convert_to_training(nn.Linear(K, N), "mxfp8")
    g = torch.Generator().manual_seed(1)
    return layer, torch.randn(M, K, generator=g), torch.randn(M, N, generator=g)


def _tp_worker(rank, ranks, style):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    layer, x, g = _layer_and_data()
    mesh = init_device_mesh("cpu", (ranks,))
    parallel = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    layer = parallelize_module(layer, mesh, parallel)
    if style == "rowwise":  # x arrives sharded along K, y leaves replicated
        x = x.chunk(ranks, dim=-1)[rank]
    else:  # x replicated, y sharded along N
        g = g.chunk(ranks, dim=-1)[rank]
    x.requires_grad_(True)
    y = layer(x)
    y.backward(g)
    return {
        "y": y.detach(),
        "dx": x.grad,
        "dw": layer.weight.grad.to_local(),
        "db": layer.bias.grad.to_local() if style == "colwise" else layer.bias.grad.full_tensor(),
    }


def _one_process():
    layer, x, g = _layer_and_data()
    x.requires_grad_(True)
    y = layer(x)
    y.backward(g)
    return {"y": y.detach(), "dx": x.grad, "dw": layer.weight.grad, "db": layer.bias.grad}


def _styles_worker(rank, ranks, styles):
    return {style: _tp_worker(rank, ranks, style) for style in styles}


@pytest.mark.slow  # processes spawned: seconds each
@pytest.mark.parametrize("style", ["colwise", "rowwise"])
def test_mxfp8_tensor_parallel_matches_one_device(style):
    _check_against_one_device(style, spawn(_tp_worker, 2, style))


@pytest.mark.slow  # four processes: tens of seconds
def test_four_ranks():
    # 128 / 4 = 32 per rank: whole MX blocks along the split dim, in both styles.
    got = spawn(_styles_worker, 4, ["colwise", "rowwise"])
    for style in ("colwise", "rowwise"):
        _check_against_one_device(style, [r[style] for r in got])


def _sequence_parallel_worker(rank, ranks):
    """Both styles with the token dim M sharded outside the layer (sequence parallel):
    colwise all-gathers x's tokens before the layer, rowwise reduce-scatters y's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    out = {}
    for style in ("colwise", "rowwise"):
        layer, x, g = _layer_and_data()
        mesh = init_device_mesh("cpu", (ranks,))
        if style == "colwise":  # x's tokens sharded in; y sharded along N out
            parallel = ColwiseParallel(input_layouts=Shard(0))
            x, g = x.chunk(ranks, dim=0)[rank], g.chunk(ranks, dim=-1)[rank]
        else:  # x sharded along K in; y's tokens sharded out
            parallel = RowwiseParallel(output_layouts=Shard(0))
            x, g = x.chunk(ranks, dim=-1)[rank], g.chunk(ranks, dim=0)[rank]
        layer = parallelize_module(layer, mesh, parallel)
        x.requires_grad_(True)
        y = layer(x)
        y.backward(g)
        # clone(): a collective's output (y, x.grad here) is waited for by the first op
        # on it; torch.save would write its buffer before the collective fills it.
        grads = {"y": y.detach(), "dx": x.grad, "dw": layer.weight.grad.to_local()}
        out[style] = {name: t.clone() for name, t in grads.items()}
    return out


@pytest.mark.slow  # processes spawned: seconds each
def test_sequence_parallel_matches_one_device():
    got = spawn(_sequence_parallel_worker, 2)
    ref = _one_process()
    colwise, rowwise = [r["colwise"] for r in got], [r["rowwise"] for r in got]
    # Colwise: y and dw are slices along N, bit for bit (x's tokens gathered whole);
    # dx sums the ranks' partial dgrads before its tokens are scattered: to rounding.
    assert torch.equal(torch.cat([r["y"] for r in colwise], dim=-1), ref["y"])
    assert torch.equal(torch.cat([r["dw"] for r in colwise], dim=0), ref["dw"])
    dx = torch.cat([r["dx"] for r in colwise], dim=0)
    torch.testing.assert_close(dx, ref["dx"], rtol=1e-5, atol=1e-5)
    # Rowwise: dx and dw are slices along K, bit for bit (dy's tokens gathered whole);
    # y sums partial products, then its tokens are scattered: to rounding.
    assert torch.equal(torch.cat([r["dx"] for r in rowwise], dim=-1), ref["dx"])
    assert torch.equal(torch.cat([r["dw"] for r in rowwise], dim=1), ref["dw"])
    y = torch.cat([r["y"] for r in rowwise], dim=0)
    torch.testing.assert_close(y, ref["y"], rtol=1e-5, atol=1e-5)


def _check_against_one_device(style, got):
    ref = _one_process()
    # Colwise: y, dw, db are the ranks' slices of the one-device run, bit for bit; dx
    # sums the ranks' partial dgrads, each rounded to float32 first: to rounding.
    # Rowwise: dx and dw are slices, bit for bit; y sums the ranks' partial products.
    sliced = {"colwise": {"y": -1, "dw": 0, "db": 0}, "rowwise": {"dx": -1, "dw": 1}}[style]
    for name, dim in sliced.items():
        whole = torch.cat([r[name] for r in got], dim=dim)
        assert torch.equal(whole, ref[name]), name
    summed = "dx" if style == "colwise" else "y"
    for r in got:
        torch.testing.assert_close(r[summed], ref[summed], rtol=1e-5, atol=1e-5)
    if style == "rowwise":
        assert torch.equal(got[0]["db"], ref["db"])


def test_a_split_that_cuts_a_block_is_refused():
    plan = extend.LinearPlan.of(lowp.Recipe.from_name("mxfp8"))
    with pytest.raises(
        ValueError,
        match=r"fc1: .*N=32 over 2 ranks: a shard of 16 columns splits the 32-column blocks of MX.*dgrad GEMM's g;",
    ):
        _tensor_parallel.check_split(plan, "N", 32, 2, "fc1")
    plan = extend.LinearPlan.of(lowp.Recipe.from_name("float8_tensorwise"))
    with pytest.raises(ValueError, match=r"fc1: RowwiseParallel .*the whole dim"):
        _tensor_parallel.check_split(plan, "K", 128, 2, "fc1")
    _tensor_parallel.check_split(
        extend.LinearPlan.of(lowp.Recipe.from_name("mxfp8")), "K", 128, 2, "fc1"
    )


def test_an_operand_a_shard_cannot_quantize_alone_is_refused():
    """A global scale (the whole tensor's amax), stochastic rounding and the Hadamard
    transform (bits by the whole tensor's element index) all depend on more than a shard."""
    nvfp4 = extend.LinearPlan.of(lowp.Recipe.from_name("nvfp4"))
    with pytest.raises(ValueError, match=r"fc1: RowwiseParallel .*forward GEMM's x .*global scale"):
        _tensor_parallel.check_split(nvfp4, "K", 128, 2, "fc1")
    with pytest.raises(ValueError, match=r"fc1: ColwiseParallel .*global scale"):
        _tensor_parallel.check_split(nvfp4, "N", 128, 2, "fc1")
    mx = lowp.Recipe.from_name("mxfp8")
    stochastic = dataclasses.replace(
        mx, dgrad=dataclasses.replace(mx.dgrad, a_rounding="stochastic")
    )
    with pytest.raises(ValueError, match=r"fc1: ColwiseParallel .*dgrad GEMM's g uses stochastic"):
        _tensor_parallel.check_split(extend.LinearPlan.of(stochastic), "N", 128, 2, "fc1")
    hadamard = dataclasses.replace(mx, wgrad=dataclasses.replace(mx.wgrad, hadamard=True))
    with pytest.raises(
        ValueError, match=r"fc1: ColwiseParallel .*wgrad GEMM's g.T uses the random Hadamard"
    ):
        _tensor_parallel.check_split(extend.LinearPlan.of(hadamard), "N", 128, 2, "fc1")
    _tensor_parallel.check_split(extend.LinearPlan.of(stochastic), "K", 128, 2, "fc1")  # g whole


# quantize_'d inference layers (lowp_torch.parallelize_quantized): fc1 ColwiseParallel,
# fc2 RowwiseParallel, D=64 features, so 32 per rank: one MX block.
D = 64
_INFERENCE_PLANS = {  # preset -> the styles its layers take without a refusal
    "mxfp8": ("colwise", "rowwise"),
    "float8_rowwise": ("colwise",),  # rows of N; its input's row scale spans K
    "float8_weight_only": ("colwise", "rowwise"),  # a row's scale kept whole over K
    "float8_tensorwise": ("colwise",),  # one weight scale, x whole
    "mxfp4": ("colwise", "rowwise"),  # packed fp4 codes: 16 bytes of K a rank
    "nvfp4": ("colwise",),  # the weight's global scale on every rank, x whole
}


def _raw(t: torch.Tensor) -> torch.Tensor:
    """t's bytes as uint8, one more trailing dim (float32 scales: 4 a value; a 0-d
    tensor scale becomes 1-D); NaN scales compare equal byte for byte."""
    return t.unsqueeze(-1).view(torch.uint8)


def _quantized_model(preset):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), nn.Linear(D, D))
    lowp_torch.quantize_(model, preset)
    return model, torch.randn(4, D, generator=torch.Generator().manual_seed(1))


def _inference_worker(rank, ranks):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    mesh = init_device_mesh("cpu", (ranks,))
    styles = {"colwise": ColwiseParallel(), "rowwise": RowwiseParallel()}
    out = {}
    for preset, names in _INFERENCE_PLANS.items():
        model, x = _quantized_model(preset)
        plan = {str(i): styles[name] for i, name in enumerate(names)}
        lowp_torch.parallelize_quantized(model, mesh, plan)
        with torch.no_grad():
            y1 = model[0](x)  # colwise: this rank's columns of N
            y2 = model[1](y1) if len(names) == 2 else None  # rowwise: summed, replicated
        weights = [model[i].weight.to_local() for i in range(len(names))]
        out[preset] = {
            "y1": y1.clone(),
            "y2": None if y2 is None else y2.clone(),
            "codes": [_raw(w.codes).clone() for w in weights],
            "scales": [_raw(w.scale).clone() for w in weights],
            "global": [w.global_scale for w in weights],
        }
    # Sequence parallel around them: x's tokens sharded in, all-gathered before fc1;
    # fc2's output reduce-scattered to tokens.
    model, x = _quantized_model("mxfp8")
    plan = {
        "0": ColwiseParallel(input_layouts=Shard(0)),
        "1": RowwiseParallel(output_layouts=Shard(0)),
    }
    lowp_torch.parallelize_quantized(model, mesh, plan)
    with torch.no_grad():
        out["sequence_parallel"] = model(x.chunk(ranks, dim=0)[rank]).clone()
    refused = {}
    for preset, name in (
        ("float8_block", "colwise"),
        ("float8_rowwise", "rowwise"),
        ("nvfp4", "rowwise"),
    ):
        model, _ = _quantized_model(preset)
        plan = {"1": styles[name]}
        if name == "rowwise":  # fc1 colwise passes its check; then fc2 is refused
            plan = {"0": styles["colwise"], **plan}
        try:
            lowp_torch.parallelize_quantized(model, mesh, plan)
        except ValueError as e:
            # Refused before any layer changed: fc1, whose split is fine, is still whole.
            refused[preset] = (str(e), type(model[0].weight).__name__)
    out["refused"] = refused
    return out


@pytest.mark.slow  # processes spawned: seconds
def test_quantized_inference_layers_shard_with_the_unsharded_bytes():
    got = spawn(_inference_worker, 2)
    for preset, names in _INFERENCE_PLANS.items():
        model, x = _quantized_model(preset)
        with torch.no_grad():
            y1 = model[0](x)
            y2 = model[1](y1)
        for i, name in enumerate(names):
            dim = 0 if name == "colwise" else 1
            w = model[i].weight
            codes, scale = _raw(w.codes), _raw(w.scale)
            for rank, r in enumerate(got):
                # Each rank's codes and scales are its slice of the whole weight's; a scale
                # that spans the split (one per row under a K split, one per tensor) whole.
                assert torch.equal(r[preset]["codes"][i], codes.chunk(2, dim)[rank]), preset
                whole = scale.dim() < 3 or scale.shape[dim] == 1
                want = scale if whole else scale.chunk(2, dim)[rank]
                assert torch.equal(r[preset]["scales"][i], want), preset
                if w.global_scale is not None:
                    assert torch.equal(_raw(r[preset]["global"][i]), _raw(w.global_scale))
        # Colwise: each output column is the one-device GEMM's, bit for bit.
        assert torch.equal(torch.cat([r[preset]["y1"] for r in got], dim=-1), y1), preset
        if len(names) == 2:
            # Rowwise: each rank's partial product over its K is rounded to float32
            # before the all-reduce sums them, so the sum agrees to rounding.
            for r in got:
                torch.testing.assert_close(r[preset]["y2"], y2, rtol=1e-5, atol=1e-5)
            if preset == "mxfp8":  # the same sums, then each rank's tokens
                y = torch.cat([r["sequence_parallel"] for r in got], dim=0)
                torch.testing.assert_close(y, y2, rtol=1e-5, atol=1e-5)
    got_refused = got[0]["refused"]
    assert set(got_refused) == {"float8_block", "float8_rowwise", "nvfp4"}, got_refused
    assert {kind for _, kind in got_refused.values()} == {"QuantizedTensor"}, got_refused
    refused = {preset: message for preset, (message, _) in got_refused.items()}
    assert re.match(
        r"1: ColwiseParallel \(out_features\) splits N=64 over 2 ranks: a shard of 32 rows "
        r"splits the 128-row blocks of BlockScaling.*, the weight;",
        refused["float8_block"],
    ), refused["float8_block"]
    assert re.match(
        r"1: RowwiseParallel \(in_features\) splits K=64 over 2 ranks: each group of the "
        r"input's AxisScaling.* spans K",
        refused["float8_rowwise"],
    ), refused["float8_rowwise"]
    assert "global scale" in refused["nvfp4"], refused["nvfp4"]


class _Mesh:
    """What the split checks read of a 1-D DeviceMesh of `ranks` ranks."""

    ndim = 1

    def __init__(self, ranks):
        self.ranks = ranks

    def size(self):
        return self.ranks


def test_quantized_layer_splits_are_checked_before_sharding():
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
    )

    layer = lowp_torch.quantize_(nn.Linear(64, 48), "mxfp8")
    assert _tensor_parallel._shard_dim(layer, "fc", ColwiseParallel(), _Mesh(3)) == 0
    assert _tensor_parallel._shard_dim(layer, "fc", RowwiseParallel(), _Mesh(2)) == 1
    with pytest.raises(ValueError, match=r"fc: RowwiseParallel .*K=64 over 3 ranks, not evenly"):
        _tensor_parallel._shard_dim(layer, "fc", RowwiseParallel(), _Mesh(3))
    with pytest.raises(
        ValueError,
        match=r"fc: RowwiseParallel .*K=64 over 4 ranks: a shard of 16 columns splits the "
        r"32-column blocks of MXScaling.*, the weight;",
    ):
        _tensor_parallel._shard_dim(layer, "fc", RowwiseParallel(), _Mesh(4))
    with pytest.raises(TypeError, match=r"fc: .*ColwiseParallel or RowwiseParallel, got Seq"):
        _tensor_parallel._shard_dim(layer, "fc", SequenceParallel(), _Mesh(2))

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    scaled = lowp_torch.quantize_(Scaled(64, 48), "mxfp8")
    with pytest.raises(TypeError, match=r"fc: Scaled has its own forward"):
        _tensor_parallel._shard_dim(scaled, "fc", ColwiseParallel(), _Mesh(2))
