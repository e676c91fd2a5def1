"""examples/train_tiny_lm, in miniature: a few steps of the byte-level LM in PyTorch and
JAX with one recipe.

Checks what the full run (`python examples/train_tiny_lm/run.py`) relies on: both
frameworks start from the same weights and follow the same loss trajectory, both
train (the loss falls), and a run resumed from a checkpoint repeats the uninterrupted
one bit for bit, losses and weights, in each framework.
"""

import dataclasses
import functools
import json
import pathlib
import sys

import numpy as np
import pytest

import lowp

torch = pytest.importorskip("torch")
for _name in ("jax", "flax", "optax"):
    pytest.importorskip(_name)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "train_tiny_lm"))
import tinylm
import train_jax
import train_torch

# Every projection dim a multiple of 32 (the MX block), as the full sizes.
CFG = tinylm.Config(
    d_model=64,
    layers=2,
    heads=2,
    seq_len=32,
    batch=4,
    steps=8,
    warmup=2,
    lr=3e-3,
    eval_every=8,
    eval_batches=1,
)
RECIPE = "mxfp8"  # every GEMM quantized, along the tokens too
TRAINERS = {"torch": train_torch.Trainer, "jax": train_jax.Trainer}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """torch on one thread for this module: on a busy 2-core machine its default two
    OpenMP threads ran these small matmuls and quantizations several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def corpus():
    return tinylm.Corpus.load()


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Both frameworks' runs, each checked for exact resume from step 4."""
    return {
        name: tinylm.train(
            make,
            CFG,
            RECIPE,
            corpus,
            tmp_path_factory.mktemp(name),
            resume_at=4,
            resume_steps=4,
            log=lambda _: None,
        )
        for name, make in TRAINERS.items()
    }


def test_same_initial_weights_in_both_frameworks():
    params = tinylm.init_params(CFG, seed=0)
    for name, make in TRAINERS.items():
        got = make(CFG, RECIPE, params).params()
        assert got.keys() == params.keys(), name
        for key, value in params.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"{name} {key}")


@pytest.mark.slow
def test_both_frameworks_train_alike(runs):
    torch_losses, jax_losses = (np.array(runs[name]["train_loss"]) for name in TRAINERS)
    for losses in (torch_losses, jax_losses):
        assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.3, losses
    # Same weights, batches and precision: the frameworks differ only in rounding order
    # (bf16 GEMM accumulation, LayerNorm): 1e-7 at step 0, 1e-4 after a few steps here,
    # where other initial weights differ by 1e-3 at step 0 and 1e-2 after a few steps.
    np.testing.assert_allclose(jax_losses[0], torch_losses[0], rtol=1e-5)
    np.testing.assert_allclose(jax_losses, torch_losses, rtol=1e-3)
    np.testing.assert_allclose(runs["jax"]["heldout"], runs["torch"]["heldout"], rtol=1e-3)


@pytest.mark.slow
def test_resume_is_exact(runs):
    assert {name: run["resume_exact"] for name, run in runs.items()} == {"torch": True, "jax": True}


def test_config_names_a_bad_dim():
    with pytest.raises(ValueError, match="d_model must be a multiple of 32.*got 100"):
        dataclasses.replace(CFG, d_model=100, heads=4)


def test_the_nvfp4_ablation_drops_the_transform_and_stochastic_rounding():
    """`nvfp4_no_rht_sr` is nvfp4's schemes with every operand rounded to nearest and
    none transformed: the comparison that shows what the two buy."""
    ablation, nvfp4 = tinylm.recipe_of("nvfp4_no_rht_sr"), lowp.Recipe.from_name("nvfp4")
    assert tinylm.recipe_of("nvfp4") == "nvfp4" and "nvfp4_no_rht_sr" in tinylm.RUNS
    for gemm in ("forward", "dgrad", "wgrad"):
        got, base = getattr(ablation, gemm), getattr(nvfp4, gemm)
        assert (got.a, got.b) == (base.a, base.b), gemm
        assert (got.a_rounding, got.b_rounding, got.hadamard) == ("nearest", "nearest", False)


PROJECTIONS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def _layer_recipes(framework: str, trainer) -> dict:
    """The recipe each block projection and the LM head of a trainer's model trains
    with (None: unquantized), by torch module name."""
    from flax import nnx

    import lowp_jax
    import lowp_torch

    names = [f"blocks.{i}.{p}" for i in range(CFG.layers) for p in PROJECTIONS] + ["head"]
    if framework == "torch":
        modules = dict(trainer.model.named_modules())
        return {
            n: modules[n].recipe if isinstance(modules[n], lowp_torch.Linear) else None
            for n in names
        }
    model = nnx.merge(trainer.graphdef, trainer.state)
    out = {}
    for n in names:
        dot = functools.reduce(getattr, n.split("."), model).dot_general
        quantized = isinstance(dot, lowp_jax.TrainingDotGeneral)
        assert not quantized or dot.small_shapes == "quantize", n  # no bf16 fallback
        out[n] = dot.recipe if quantized else None
    return out


@pytest.mark.parametrize(
    "run", ["bf16", "float8_blockwise", "nvfp4", *lowp.Recipe.ablation_names()]
)
def test_every_block_projection_trains_with_the_runs_recipe(run):
    """What `bench/probes/nvfp4_ablation_lm.py` compares is the recipe itself, in both
    frameworks: each block projection quantizes with the run's `lowp.Recipe` (an
    ablation variant's own, not nvfp4's), the LM head with none, and bf16 with none."""
    want = None if run == "bf16" else lowp.Recipe.of(tinylm.recipe_of(run))
    assert want is None or want.name == run
    params = tinylm.init_params(CFG, seed=0)
    for framework, make in TRAINERS.items():
        got = _layer_recipes(framework, make(CFG, run, params))
        assert got.pop("head") is None, framework
        assert got == dict.fromkeys(got, want), framework


MOE_CFG = dataclasses.replace(CFG, ffn="moe", experts=4, top_k=2)


def test_moe_initial_weights_load_in_both_frameworks():
    """The stacked experts (E, out, in) and the router go in and out of both models."""
    params = tinylm.init_params(MOE_CFG, seed=0)
    assert params["blocks.0.moe.experts.w2"].shape == (4, 64, 128)
    for name, make in TRAINERS.items():
        got = make(MOE_CFG, "float8_rowwise", params).params()
        assert got.keys() == params.keys(), name
        for key, value in params.items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"{name} {key}")


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(TRAINERS))
def test_moe_trains_with_grouped_recipes_like_bf16(framework, corpus, tmp_path):
    """The MoE tiny LM (grouped GEMMs: lowp_torch.GroupedExperts / lowp_jax.nnx's)
    trains with float8_rowwise and mxfp8 like bf16, and resumes exactly (the full-size
    comparison: docs/moe.md)."""
    runs = {
        run: tinylm.train(
            TRAINERS[framework],
            MOE_CFG,
            run,
            corpus,
            tmp_path,
            resume_at=4,
            resume_steps=2 if run == "mxfp8" else 0,
            log=lambda _: None,
        )
        for run in ("bf16", "float8_rowwise", "mxfp8")
    }
    bf16 = runs["bf16"]["heldout"][-1][1]
    for run, result in runs.items():
        losses = np.array(result["train_loss"])
        assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.3, (run, losses)
        assert abs(result["heldout"][-1][1] - bf16) < 0.02 * bf16, (run, result["heldout"])
    assert runs["mxfp8"]["resume_exact"] is True


def test_ablation_probe_keeps_compiled_and_eager_runs_apart(tmp_path, capsys):
    """`nvfp4_ablation_lm --compile` (torch only) writes its setting into the --json
    file; a rerun with the other setting, and a table of files of both, are refused
    before anything trains or prints a row."""
    from bench.probes import nvfp4_ablation_lm as probe

    with pytest.raises(SystemExit):  # argparse's error
        probe.main(["--framework", "jax", "--compile", "--json", str(tmp_path / "j.json")])
    cfg = dataclasses.replace(tinylm.SIZES["tiny"], steps=10, warmup=1)
    eager, compiled = tmp_path / "eager.json", tmp_path / "compiled.json"
    base = {"framework": "torch", "config": dataclasses.asdict(cfg)}
    rows = [{"seed": 0, "run": "bf16", "heldout": 3.5, "cpu_s": 1.0}]
    eager.write_text(json.dumps(base | {"rows": rows, "compiled": False}))
    compiled.write_text(json.dumps(base | {"rows": rows, "compiled": True}))
    with pytest.raises(SystemExit, match="--compile setting"):
        probe.main(["--steps", "10", "--seeds", "0", "--compile", "--json", str(eager)])
    with pytest.raises(SystemExit, match="--compile setting"):
        probe.main(["--table", str(eager), str(compiled), "--runs", "bf16"])
    probe.main(["--table", str(compiled), "--runs", "bf16"])
    out = capsys.readouterr().out
    assert "torch: torch.compile'd" in out and "| torch | `bf16` | 3.5000" in out
    eager.write_text(json.dumps(base | {"rows": rows}))  # a file from before --compile
    probe.main(["--table", str(eager), "--runs", "bf16"])
    assert "torch: eager" in capsys.readouterr().out
