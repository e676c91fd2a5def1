"""FSDP2 with quantized all-gather (lowp_torch._fsdp), on CPU processes talking gloo:
the gathered codes and scales are `lowp.quantize`'s of the full weight, a sharded run
trains as the one-process run does (and its sharded checkpoint loads into one process
with those bytes), and the gather moves about half bf16's bytes."""

import contextlib
import dataclasses
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import lowp
import lowp_torch
from lowp import extend
from lowp_torch import _fsdp

RECIPES = ["float8_tensorwise", "float8_rowwise", "mxfp8"]
K, N, HIDDEN = 64, 128, 128
STEPS, TOKENS = 3, 32


def spawn(worker, ranks: int, *args) -> list:
    """worker(rank, ranks, *args) run in `ranks` fresh processes joined by gloo; each
    rank's return value."""
    with tempfile.TemporaryDirectory() as d:
        torch.multiprocessing.spawn(_entry, args=(worker, ranks, d, args), nprocs=ranks)
        return [torch.load(os.path.join(d, f"{r}.pt"), weights_only=False) for r in range(ranks)]


def _entry(rank, worker, ranks, d, args):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{d}/rendezvous", rank=rank, world_size=ranks
    )
    try:
        torch.save(worker(rank, ranks, *args), os.path.join(d, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def sharded(model: nn.Module, ranks: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ranks,))
    _fsdp.fsdp_quantized_all_gather(model)
    for layer in model.modules():
        if isinstance(layer, lowp_torch.Linear) and layer is not model:
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _bytes(t: torch.Tensor) -> np.ndarray:
    # A copy first: .numpy() of FSDP2's gather buffers would make them unresizable.
    return t.reshape(-1).view(torch.uint8).clone().numpy()


def _gathered_worker(rank, ranks, recipes):
    """For each recipe, the full weights and the bytes of the operands the GEMMs took of
    them in one step: `fsdp` the gathers of a sharded layer (forward before the forward,
    dgrad before the backward), `root` a root layer's, which FSDP2 keeps unsharded after
    the forward, so the backward gathers its dgrad operand itself."""
    out = {}
    for recipe in recipes:
        dtype = torch.bfloat16 if recipe == "mxfp8" else torch.float32
        torch.manual_seed(0)
        model = lowp_torch.convert_to_training(nn.Sequential(nn.Linear(K, N, dtype=dtype)), recipe)
        root = lowp_torch.convert_to_training(nn.Linear(K, N, dtype=dtype), recipe)
        full = {"fsdp": model[0].weight.detach().clone(), "root": root.weight.detach().clone()}
        model, root = sharded(model, ranks), sharded(root, ranks)
        taken = {"fsdp": {}, "root": {}}
        for name, layer in (("fsdp", model), ("root", root)):
            with _operands_taken(taken[name]):
                x = torch.randn(TOKENS, K, dtype=dtype, requires_grad=True)
                layer(x).float().square().mean().backward()
        out[recipe] = {"full": full, "taken": taken}
    return out


@contextlib.contextmanager
def _operands_taken(into: dict):
    """Record, as `into[phase] = (codes, scale)` bytes, the gathered operands the layers'
    GEMMs take in the block; `into["gathered_here"]`: how many the layers gathered
    themselves, outside FSDP2's gathers."""
    forward, dgrad, gather_now = (
        _fsdp.GatheredWeight.lowp_gathered_operands,
        _fsdp.GatheredWeight.lowp_dgrad_operand,
        _fsdp._gather_now,
    )

    def record(phase, q):
        into[phase] = (_bytes(q.codes), _bytes(q.scale))
        return q

    def counting(*args):
        into["gathered_here"] = into.get("gathered_here", 0) + 1
        return gather_now(*args)

    _fsdp.GatheredWeight.lowp_gathered_operands = lambda w, b: (
        record("forward", forward(w, b)[0]),
        w,
    )
    _fsdp.GatheredWeight.lowp_dgrad_operand = lambda w: record("dgrad", dgrad(w))
    _fsdp._gather_now = counting
    try:
        yield
    finally:
        _fsdp.GatheredWeight.lowp_gathered_operands = forward
        _fsdp.GatheredWeight.lowp_dgrad_operand = dgrad
        _fsdp._gather_now = gather_now


def _reference(full: torch.Tensor, scheme) -> tuple:
    q = lowp.quantize(_numpy(full), scheme)
    return np.asarray(q.codes).view(np.uint8), np.asarray(q.scale).reshape(-1).view(np.uint8)


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _check_gathered(results):
    for recipe in RECIPES:
        plan = extend.LinearPlan.of(lowp.Recipe.from_name(recipe))
        dgrad = plan.transposed_operand("w")
        dgrad_scheme = plan.forward.b.scheme if dgrad.reuses_codes else dgrad.along_first_axis
        for rank in results:
            r = rank[recipe]
            for layer, taken in r["taken"].items():
                for phase, scheme in (("forward", plan.forward.b.scheme), ("dgrad", dgrad_scheme)):
                    codes, scale = _reference(r["full"][layer], scheme)
                    got = taken[phase]
                    np.testing.assert_array_equal(
                        got[0].reshape(codes.shape), codes, err_msg=recipe
                    )
                    np.testing.assert_array_equal(got[1], scale, err_msg=recipe)
            # FSDP2 gathered both for the sharded layer; the root's dgrad operand was
            # gathered by the layer, unless it is the forward's codes.
            assert r["taken"]["fsdp"].get("gathered_here", 0) == 0, recipe
            here = r["taken"]["root"].get("gathered_here", 0)
            assert here == (0 if dgrad.reuses_codes else 1), (recipe, here)


@pytest.mark.slow  # processes spawned: seconds each
def test_gathered_bytes_are_the_full_weights_quantize():
    _check_gathered(spawn(_gathered_worker, 2, RECIPES))


@pytest.mark.slow
def test_gathered_bytes_on_four_ranks():
    _check_gathered(spawn(_gathered_worker, 4, RECIPES))


def test_main_grad_accumulation_is_refused():
    recipe = dataclasses.replace(
        lowp.Recipe.from_name("float8_rowwise"), fp32_weight_grad_accumulation=True
    )
    model = lowp_torch.convert_to_training(nn.Sequential(nn.Linear(K, N)), recipe)
    with pytest.raises(ValueError, match="0: fp32_weight_grad_accumulation is not supported"):
        _fsdp.fsdp_quantized_all_gather(model)


def test_a_w_operand_a_shard_cannot_quantize_alone_is_refused():
    """The gather quantizes each shard with nearest rounding, no transform, no global
    scale: a recipe whose w operands want otherwise is refused for its real cause."""
    model = lowp_torch.convert_to_training(nn.Sequential(nn.Linear(K, N)), "nvfp4")
    with pytest.raises(ValueError, match=r"0: recipe nvfp4 .*global scale is the whole w's amax"):
        _fsdp.fsdp_quantized_all_gather(model)
    mx = lowp.Recipe.from_name("mxfp8")
    for forward, cause in (
        (dataclasses.replace(mx.forward, b_rounding="stochastic"), "stochastic rounding"),
        (dataclasses.replace(mx.forward, hadamard=True), "the random Hadamard transform"),
    ):
        recipe = dataclasses.replace(mx, forward=forward)
        model = lowp_torch.convert_to_training(nn.Sequential(nn.Linear(K, N)), recipe)
        with pytest.raises(
            ValueError, match=rf"0: recipe mxfp8 quantizes forward.b's w with {cause}"
        ):
            _fsdp.fsdp_quantized_all_gather(model)
    hp_dgrad = dataclasses.replace(mx, dgrad=lowp.GemmSpec(None, None))
    model = lowp_torch.convert_to_training(nn.Sequential(nn.Linear(K, N)), hp_dgrad)
    with pytest.raises(ValueError, match="0: recipe mxfp8 needs w in high precision for its dgrad"):
        _fsdp.fsdp_quantized_all_gather(model)


def test_a_shard_that_splits_an_mx_block_is_refused():
    scheme = lowp.MXScaling("float8_e4m3fn", axis=-2)
    with pytest.raises(ValueError, match=r"fc1: a shard of 16 rows .* 32-row blocks"):
        _fsdp._quantize_shard(torch.zeros(16, K), scheme, None, 4, "fc1")


def _model(recipe, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(K, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, N)).to(dtype)
    return lowp_torch.convert_to_training(model, recipe)


def _data(ranks):
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, ranks, TOKENS, K, generator=g)


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t.to_local() if hasattr(t, "to_local") else t
    return (t.data_ if isinstance(t, _fsdp.ShardedWeight) else t).detach().clone()


def _training_worker(rank, ranks, recipe, checkpoint):
    """Each rank's losses and its shard of every parameter after STEPS SGD steps, each
    rank training on its own slice of every batch; the sharded state_dict saved to
    `checkpoint` with torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp

    model = sharded(_model(recipe), ranks)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x in _data(ranks):
        loss = model(x[rank]).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    dcp.save(model.state_dict(), checkpoint_id=checkpoint)
    return {"losses": losses, "params": {k: _local(v) for k, v in model.named_parameters()}}


def _one_process(recipe, ranks):
    """The same run in one process: the ranks' slices run one after another, their
    gradients summed and averaged, as FSDP2's reduce-scatter does."""
    model = _model(recipe)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x in _data(ranks):
        step = []
        for r in range(ranks):
            loss = model(x[r]).square().mean()
            loss.backward()
            step.append(loss.detach())
        for p in model.parameters():
            p.grad /= ranks
        opt.step()
        opt.zero_grad()
        losses.append(step)
    return losses, dict(model.named_parameters())


@pytest.mark.slow  # processes spawned: seconds each
@pytest.mark.parametrize("recipe", RECIPES)
def test_sharded_training_matches_one_process(recipe):
    # Two ranks: the reduce-scatter adds two gradients, which commutes, so the sharded
    # run is bit for bit the one-process run (four ranks would sum in another order).
    import torch.distributed.checkpoint as dcp

    with tempfile.TemporaryDirectory() as checkpoint:
        results = spawn(_training_worker, 2, recipe, checkpoint)
        losses, params = _one_process(recipe, 2)
        # The sharded checkpoint loads into one process with the one-process run's bytes.
        loaded = {name: torch.zeros_like(p) for name, p in params.items()}
        dcp.load(loaded, checkpoint_id=checkpoint)
    for name, p in params.items():
        assert torch.equal(loaded[name], p.detach()), name
    for r, got in enumerate(results):
        for step, loss in enumerate(got["losses"]):
            assert torch.equal(loss, losses[step][r]), (step, r)
    for name, p in params.items():
        shards = torch.cat([got["params"][name] for got in results])
        torch.testing.assert_close(shards, p.detach(), rtol=0, atol=0, msg=name)


@contextlib.contextmanager
def _bytes_sent(into: dict):
    """Count, into `into["gather"]` and `into["all_reduce"]`, the bytes this rank hands
    to all-gathers (FSDP2's and the layers' own) and all-reduces (the shared amaxes)."""
    real = dist.all_gather_single, dist.all_reduce

    def gather(output, input, *args, **kwargs):
        into["gather"] += input.numel() * input.element_size()
        return real[0](output, input, *args, **kwargs)

    def all_reduce(t, *args, **kwargs):
        into["all_reduce"] += t.numel() * t.element_size()
        return real[1](t, *args, **kwargs)

    into.update(gather=0, all_reduce=0)
    dist.all_gather_single, dist.all_reduce = gather, all_reduce
    try:
        yield
    finally:
        dist.all_gather_single, dist.all_reduce = real


def _gather_bytes_worker(rank, ranks, recipes):
    """Bytes each rank sends to the collectives of one training step of a bfloat16
    model: recipe None gathers bf16 (plain fully_shard), a recipe its codes and scales."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    out = {}
    for recipe in recipes:
        model = _model(recipe or "float8_rowwise", torch.bfloat16)
        if recipe is None:  # the baseline: the same layers, their bf16 weights gathered
            mesh = init_device_mesh("cpu", (ranks,))
            for layer in model.modules():
                if isinstance(layer, lowp_torch.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        else:
            model = sharded(model, ranks)
        x = _data(ranks)[0, rank].bfloat16()
        model(x).float().square().mean().backward()  # a first step sets FSDP2 up
        out[recipe] = {}
        with _bytes_sent(out[recipe]):
            model(x).float().square().mean().backward()
    return out


@pytest.mark.slow  # processes spawned: seconds each
def test_fp8_all_gather_sends_about_half_of_bf16():
    recipes = [None, *RECIPES]
    sent = spawn(_gather_bytes_worker, 2, recipes)[0]
    bf16 = sent[None]["gather"]
    assert sent[None]["all_reduce"] == 0
    for recipe in RECIPES:
        gather, all_reduce = sent[recipe]["gather"], sent[recipe]["all_reduce"]
        ratio = gather / bf16
        print(
            f"{recipe}: {gather} bytes all-gathered a step (+{all_reduce} all-reduced), "
            f"bf16 {bf16}: {ratio:.3f} ({(gather + all_reduce) / bf16:.3f} with the all-reduces)"
        )
        # Each phase gathers one set of codes and its scales (lowp_torch._fsdp).
        assert (gather + all_reduce) / bf16 <= 0.55, (recipe, ratio)


def _checkpointing_worker(rank, ranks):
    """Output and gradient shards of one step, then of the same step under activation
    checkpointing (the forward recomputed in the backward, from a fresh gather)."""
    from torch.utils.checkpoint import checkpoint

    model = sharded(_model("float8_rowwise"), ranks)
    x = _data(ranks)[0, rank]
    runs = []
    for run in (model, lambda x: checkpoint(model, x, use_reentrant=False)):
        y = run(x)
        y.square().mean().backward()
        runs.append((y.detach(), {k: _local(p.grad) for k, p in model.named_parameters()}))
        model.zero_grad()
    return runs


@pytest.mark.slow
def test_activation_checkpointing_gives_the_same_step():
    for plain, checkpointed in spawn(_checkpointing_worker, 2):
        assert torch.equal(plain[0], checkpointed[0])
        for name, grad in plain[1].items():
            assert torch.equal(grad, checkpointed[1][name]), name
