"""FSDP2 with quantized all-gather (lowp_torch._fsdp), on CPU processes talking gloo:
the gathered codes and scales are `lowp.quantize`'s of the full weight, a sharded run
trains as the one-process run does (and its sharded checkpoint loads into one process
with those bytes), and the gather moves about half bf16's bytes."""

import contextlib
import dataclasses
import gc
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
        # A rank once aborted at exit ("terminate called without an active exception"),
        # as gloo does when its work objects die during interpreter finalization
        # (pytorch/pytorch#179291). FSDP2's modules can hold them in reference cycles:
        # free them while the interpreter lives, with both ranks past every collective.
        gc.collect()
        dist.barrier()
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
    """For each recipe, the full weight and the bytes of the operands the GEMMs took of
    it in one step: `fsdp` the gathers of a sharded layer (forward before the forward,
    dgrad before the backward), `root` a root layer's, which FSDP2 keeps unsharded after
    the forward, so the backward gathers its dgrad operand itself."""
    out = {}
    for recipe in recipes:
        dtype = torch.bfloat16 if recipe == "mxfp8" else torch.float32
        out[recipe] = {}
        for where in ("fsdp", "root"):
            torch.manual_seed(0)
            model = nn.Linear(K, N, dtype=dtype)
            model = nn.Sequential(model) if where == "fsdp" else model
            model = lowp_torch.convert_to_training(model, recipe)
            full = {name: p.detach().clone() for name, p in model.named_parameters()}
            model = sharded(model, ranks)
            taken: dict = {}
            with _operands_taken(taken):
                x = torch.randn(TOKENS, K, dtype=dtype, requires_grad=True)
                model(x).float().square().mean().backward()
            out[recipe][where] = {"full": full, "taken": taken}
    return out


@contextlib.contextmanager
def _operands_taken(into: dict):
    """Record, as `into[layer][phase] = (codes, scale)` bytes, the gathered operands the
    layers' GEMMs take in the block; `into["gathered_here"]`: how many the layers
    gathered themselves, outside FSDP2's gathers."""
    forward, dgrad, gather_now = (
        _fsdp.GatheredWeight.lowp_gathered_operands,
        _fsdp.GatheredWeight.lowp_dgrad_operand,
        _fsdp._gather_now,
    )

    def record(w, phase, q):
        into.setdefault(w._shard.layer_name, {})[phase] = (_bytes(q.codes), _bytes(q.scale))
        return q

    def counting(*args):
        into["gathered_here"] = into.get("gathered_here", 0) + 1
        return gather_now(*args)

    _fsdp.GatheredWeight.lowp_gathered_operands = lambda w, b: (
        record(w, "forward", forward(w, b)[0]),
        w,
    )
    _fsdp.GatheredWeight.lowp_dgrad_operand = lambda w: record(w, "dgrad", dgrad(w))
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


def _check_operands(recipe: str, full: dict, taken: dict) -> None:
    """The operands each layer's GEMMs took (`_operands_taken`) are `lowp.quantize`'s of
    its full weight (`full`: "0.weight" -> w, or "weight" for a model that is one layer).
    A first layer takes no dgrad operand: nothing asks for its input's gradient."""
    plan = extend.LinearPlan.of(lowp.Recipe.from_name(recipe))
    for layer, phases in taken.items():
        if layer == "gathered_here":
            continue
        w = full["weight" if layer == "linear" else f"{layer}.weight"]
        for phase, got in phases.items():
            codes, scale = _reference(w, _fsdp._phase_scheme(plan, phase))
            np.testing.assert_array_equal(got[0].reshape(codes.shape), codes, err_msg=recipe)
            np.testing.assert_array_equal(got[1], scale, err_msg=recipe)
        assert "forward" in phases, (recipe, layer)


def _check_gathered(results):
    for recipe in RECIPES:
        reuse = extend.LinearPlan.of(lowp.Recipe.from_name(recipe)).transposed_operand("w")
        for rank in results:
            for r in rank[recipe].values():
                _check_operands(recipe, r["full"], r["taken"])
                layers = [v for k, v in r["taken"].items() if k != "gathered_here"]
                assert [set(v) for v in layers] == [{"forward", "dgrad"}], recipe
            # FSDP2 gathered both for the sharded layer; the root's dgrad operand was
            # gathered by the layer, unless it is the forward's codes.
            assert rank[recipe]["fsdp"]["taken"].get("gathered_here", 0) == 0, recipe
            here = rank[recipe]["root"]["taken"].get("gathered_here", 0)
            assert here == (0 if reuse.reuses_codes else 1), (recipe, here)


@pytest.mark.slow  # processes spawned: seconds each
def test_gathered_bytes_are_the_full_weights_quantize():
    _check_gathered(spawn(_gathered_worker, 2, RECIPES))


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
    with pytest.raises(
        ValueError,
        match=r"fc1: a shard of 16 rows splits the 32-row blocks of MX.* \(out_features / 4 ranks\)",
    ):
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
    rank training on its own slice of every batch; the operands its GEMMs took in the
    first step (`_operands_taken`); the sharded state_dict saved to `checkpoint` with
    torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp

    model = sharded(_model(recipe), ranks)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses, taken = [], {}
    for step, x in enumerate(_data(ranks)):
        with _operands_taken(taken) if step == 0 else contextlib.nullcontext():
            loss = model(x[rank]).square().mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    dcp.save(model.state_dict(), checkpoint_id=checkpoint)
    params = {k: _local(v) for k, v in model.named_parameters()}
    return {"losses": losses, "params": params, "taken": taken}


def _load_worker(rank, ranks, recipe, checkpoint):
    """This rank's shard of every parameter of a sharded model loaded from `checkpoint`,
    saved by any number of ranks."""
    import torch.distributed.checkpoint as dcp

    model = sharded(_model(recipe), ranks)
    state = model.state_dict()
    dcp.load(state, checkpoint_id=checkpoint)
    model.load_state_dict(state)
    return {k: _local(v) for k, v in model.named_parameters()}


def _initial(recipe) -> dict:
    """`_model(recipe)`'s parameters before training."""
    return {name: p.detach() for name, p in _model(recipe).named_parameters()}


def _whole(shards: list[dict]) -> dict:
    """The ranks' dim-0 shards of each parameter, concatenated."""
    return {name: torch.cat([s[name] for s in shards]) for name in shards[0]}


def _saved_quantized(params: dict, path: str) -> bytes:
    """The bytes of `save_quantized` of the float model holding `params`, quantized for
    inference with mxfp8."""
    model = nn.Sequential(nn.Linear(K, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, N))
    model.load_state_dict(params)
    lowp_torch.quantize_(model, "mxfp8")
    lowp_torch.save_quantized(model, path)
    with open(path, "rb") as f:
        return f.read()


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
    # run is bit for bit the one-process run (four ranks sum in another order: below).
    import torch.distributed.checkpoint as dcp

    losses, params = _one_process(recipe, 2)
    params = {name: p.detach() for name, p in params.items()}
    with tempfile.TemporaryDirectory() as checkpoint:
        results = spawn(_training_worker, 2, recipe, checkpoint)
        # The sharded checkpoint loads into one process with the one-process run's
        # bytes, and (mxfp8, to keep CI short) into four ranks: resharded 2 -> 4.
        loaded = {name: torch.zeros_like(p) for name, p in params.items()}
        dcp.load(loaded, checkpoint_id=checkpoint)
        on_four = _whole(spawn(_load_worker, 4, recipe, checkpoint)) if recipe == "mxfp8" else {}
        saved = [_saved_quantized(p, os.path.join(checkpoint, "q.lowp")) for p in (loaded, params)]
    assert saved[0] == saved[1]  # save_quantized of the loaded and the one-process model
    for name, p in params.items():
        assert torch.equal(loaded[name], p), name
        assert name not in on_four or torch.equal(on_four[name], p), name
    for r, got in enumerate(results):
        _check_operands(recipe, _initial(recipe), got["taken"])
        for step, loss in enumerate(got["losses"]):
            assert torch.equal(loss, losses[step][r]), (step, r)
    for name, p in _whole([got["params"] for got in results]).items():
        assert torch.equal(p, params[name]), name


@pytest.mark.slow  # four processes: tens of seconds
def test_four_ranks_train_as_one_process_and_reshard_to_two():
    import torch.distributed.checkpoint as dcp

    recipe = "mxfp8"  # N / 4 ranks = 32 rows: whole MX blocks along N for the dgrad
    losses, params = _one_process(recipe, 4)
    with tempfile.TemporaryDirectory() as checkpoint:
        results = spawn(_training_worker, 4, recipe, checkpoint)
        loaded = {name: torch.zeros_like(p) for name, p in params.items()}
        dcp.load(loaded, checkpoint_id=checkpoint)
        on_two = _whole(spawn(_load_worker, 2, recipe, checkpoint))
    trained = _whole([got["params"] for got in results])
    for name, p in trained.items():  # resharded 4 -> 1 and 4 -> 2, bit for bit
        assert torch.equal(loaded[name], p), name
        assert torch.equal(on_two[name], p), name
    initial = _initial(recipe)
    for r, got in enumerate(results):
        _check_operands(recipe, initial, got["taken"])  # the gathers: the unsharded bytes
        assert torch.equal(got["losses"][0], losses[0][r])  # before any update: exact
        for step in range(1, STEPS):
            # The reduce-scatter sums four gradients in another order than the one
            # process does: parameters differ in float32's last bits, which can move an
            # fp8 code by one; the losses agree to that.
            torch.testing.assert_close(got["losses"][step], losses[step][r], rtol=1e-3, atol=0)
    for name, p in trained.items():
        torch.testing.assert_close(p, params[name].detach(), rtol=1e-3, atol=1e-5)


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
    checkpointing (the forward recomputed in the backward, from a fresh gather), and
    the bytes each sent to collectives (`_bytes_sent`)."""
    from torch.utils.checkpoint import checkpoint

    model = sharded(_model("float8_rowwise"), ranks)
    x = _data(ranks)[0, rank]
    model(x).square().mean().backward()  # a first step sets FSDP2 up
    model.zero_grad()
    runs = []
    for run in (model, lambda x: checkpoint(model, x, use_reentrant=False)):
        sent: dict = {}
        with _bytes_sent(sent):
            y = run(x)
            y.square().mean().backward()
        grads = {k: _local(p.grad) for k, p in model.named_parameters()}
        runs.append((y.detach(), grads, sent))
        model.zero_grad()
    return runs


@pytest.mark.slow
def test_activation_checkpointing_gives_the_same_step():
    for plain, checkpointed in spawn(_checkpointing_worker, 2):
        assert torch.equal(plain[0], checkpointed[0])
        for name, grad in plain[1].items():
            assert torch.equal(grad, checkpointed[1][name]), name
        # The recomputed forward gathers the forward's codes once more: three gathers
        # of one orientation against two (bf16's checkpointed step gathers twice).
        ratio = checkpointed[2]["gather"] / plain[2]["gather"]
        print(f"checkpointed / plain bytes gathered: {ratio:.3f}")
        assert 1.0 < ratio <= 1.5, ratio


def _compiled_worker(rank, ranks):
    """Loss, gradient shards and bytes sent of one step, eager, then compiled with
    Inductor (torch.compile's default backend, as a user compiles)."""
    model = sharded(_model("float8_rowwise"), ranks)
    x = _data(ranks)[0, rank]
    model(x).square().mean().backward()  # a first step sets FSDP2 up
    model.zero_grad()
    runs = []
    for run in (model, torch.compile(model)):
        sent: dict = {}
        with _bytes_sent(sent):
            loss = run(x).square().mean()
            loss.backward()
        grads = {k: _local(p.grad) for k, p in model.named_parameters() if p.grad is not None}
        runs.append((loss.detach(), grads, sent))
        model.zero_grad()
    return runs


@pytest.mark.slow  # processes spawned, and an Inductor compile: about 100 s
def test_compiled_step_is_the_eager_step():
    for eager, compiled in spawn(_compiled_worker, 2):
        assert torch.equal(eager[0], compiled[0])
        assert set(compiled[1]) == set(eager[1])  # every parameter has its gradient
        for name, grad in eager[1].items():
            assert torch.equal(grad, compiled[1][name]), name
        assert compiled[2] == eager[2]  # the same gathers and all-reduces, byte for byte
