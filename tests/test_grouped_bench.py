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
