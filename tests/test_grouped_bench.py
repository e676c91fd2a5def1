"""bench/moe.py, the "moe" section of bench/run.py: routing, the summary's MoE key, and
a CPU smoke run of the section (the plumbing, not the speed)."""

import json
import pathlib
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))

from bench import moe, run, summary


@pytest.mark.parametrize("routing", moe.ROUTINGS)
@pytest.mark.parametrize("shape", moe.FULL + moe.SMALL)
def test_routing_is_aligned_and_complete(shape, routing):
    counts = moe.counts(shape, routing)
    assert int(counts.sum()) == shape.tokens
    assert (counts % moe.ALIGN == 0).all() and (counts > 0).all()
    if routing == "skewed":
        assert counts[0] > 2 * counts[-1]


def test_summary_ratio_is_against_the_same_runs_bf16():
    rows = [
        {
            "shape": "S",
            "routing": "balanced",
            "impl": "bf16",
            "recipe": "bf16",
            "mode": "eager",
            "ms": 3.0,
        },
        {
            "shape": "S",
            "routing": "balanced",
            "impl": "lowp",
            "recipe": "float8_rowwise",
            "mode": "eager",
            "ms": 2.0,
        },
        {
            "shape": "S",
            "routing": "balanced",
            "impl": "torchao",
            "recipe": "float8_rowwise",
            "mode": "eager",
            "ms": 2.5,
        },
    ]
    got = summary.build({"moe": {"rows": rows, "skipped": [], "errors": []}})
    assert got["moe_fwd_bwd_speedup_vs_bf16"] == {
        "float8_rowwise": {"S balanced": {"eager": 1.5}},
        "torchao float8_rowwise": {"S balanced": {"eager": 1.2}},
    }


@pytest.mark.slow
def test_the_section_runs_on_cpu(tmp_path):
    argv = [
        "--small",
        "--sections",
        "moe",
        "--recipes",
        "float8_rowwise",
        "--modes",
        "eager,compiled",
    ]
    result = run.main([*argv, "--out", str(tmp_path / "run.json")])
    sec = result["sections"]["moe"]
    assert sec["errors"] == []
    impls = {(r["impl"], r["mode"]) for r in sec["rows"]}
    assert {("bf16", "eager"), ("lowp", "compiled"), ("jax_lowp", "jit")} <= impls
    speedups = json.loads(json.dumps(result["summary"]))["moe_fwd_bwd_speedup_vs_bf16"]
    assert set(speedups) == {"float8_rowwise", "jax_lowp float8_rowwise"}


def test_emulated_recipes_are_timed_only_when_named():
    """Emulated grouped GEMMs took minutes of an H200 run (float8_tensorwise 369 ms a
    step): by default the section times only recipes with an fp8 grouped kernel."""
    import torch

    recipes = ["float8_rowwise", "float8_tensorwise", "float8_rowwise_gw_hp"]
    kept, skipped = moe.recipes_to_time(recipes, torch.device("cpu"), named=False)
    assert kept == [] and [r for r, _ in skipped] == recipes
    assert "cpu has no fp8 grouped GEMM" in skipped[0][1]
    kept, skipped = moe.recipes_to_time(recipes, torch.device("cpu"), named=True)
    assert kept == recipes and skipped == []


def test_kernel_problem_names_the_high_precision_gemm(monkeypatch):
    from lowp_torch import _grouped_mm

    monkeypatch.setattr(_grouped_mm, "_gemm_kernel_problem", lambda gemm, device: None)
    assert _grouped_mm.kernel_problem("float8_rowwise", "cpu") is None
    why = _grouped_mm.kernel_problem("float8_rowwise_gw_hp", "cpu")
    assert why == "its wgrad GEMM is in high precision (float32, emulated)"
