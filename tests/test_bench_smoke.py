"""bench/run.py --small: the sections run on CPU and the summary has the targets' form.

One small run (about 10 s of CPU) feeds the checks; the error, budget and merge paths
are checked without measuring anything heavy.
"""

import json
import pathlib
import sys

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))

from bench import _timing, linear_step, run, summary

# The form bench/results/h200.json is committed in (the targets summary).
SUMMARY_KEYS = {
    "cast_fraction_of_copy",
    "linear_fwd_bwd_speedup_vs_bf16",
    "jax_dense_fwd_bwd_speedup_vs_bf16",
    "slowest_vs_bf16_small_shapes",
}
LINEAR_CELL = {"eager", "compiled", "torchao_compiled", "limit"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    argv = ["--small", "--sections", "linear,sweep,memory", "--recipes", "float8_rowwise,mxfp8"]
    argv += ["--out", str(out / "run.json"), "--summary", str(out / "summary.json")]
    result = run.main(argv)
    return out, result


@pytest.mark.slow
def test_summary_has_the_targets_form(small_run):
    out, result = small_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result["summary"]))
    assert SUMMARY_KEYS <= set(summary)
    assert set(summary["cast_fraction_of_copy"]) == {"tensorwise", "rowwise", "mxfp8"}
    linear = summary["linear_fwd_bwd_speedup_vs_bf16"]
    assert set(linear) == {"float8_rowwise", "mxfp8"}
    for shapes in linear.values():
        assert list(shapes) == ["64x128x256"]
        assert all(set(cell) == LINEAR_CELL for cell in shapes.values())
    assert linear["float8_rowwise"]["64x128x256"]["eager"] > 0
    assert linear["float8_rowwise"]["64x128x256"]["limit"] > 0
    assert linear["mxfp8"]["64x128x256"]["limit"] is None  # no MX GEMM to time
    assert summary["slowest_vs_bf16_small_shapes"] > 0
    assert summary["slowest_small_shape"]["recipe"] == "float8_rowwise"
    # the bf16 control: a second bf16 layer's ratio at every swept shape, and its slowest
    control = summary["small_shapes_bf16_control_vs_bf16"]
    assert list(control) == ["eager"] and set(control["eager"]) == {"16x128x128", "64x128x128"}
    assert summary["slowest_bf16_control_vs_bf16"] == min(control["eager"].values()) > 0
    assert summary["fastest_bf16_control_vs_bf16"] == max(control["eager"].values())
    assert "mxfp8" in summary["numerics_only"]  # CPU: every GEMM emulated
    assert set(summary["memory_peak"]) == {"bf16", "float8_rowwise", "mxfp8"}


@pytest.mark.slow
def test_results_file_keeps_every_row(small_run):
    out, _ = small_run
    saved = json.loads((out / "run.json").read_text())
    assert set(saved["sections"]) == {"linear", "sweep", "memory"}
    assert all(not s["errors"] and not s["skipped"] for s in saved["sections"].values())
    linear = {(r["impl"], r["recipe"]) for r in saved["sections"]["linear"]["rows"]}
    assert {("bf16", "bf16"), ("lowp", "float8_rowwise"), ("limit", "float8_rowwise")} <= linear
    sweep = saved["sections"]["sweep"]["rows"]
    assert sorted({r["M"] for r in sweep}) == [16, 64]
    assert saved["meta"]["torch"]


@pytest.mark.slow
def test_merge_gives_the_same_summary(small_run, tmp_path):
    out, result = small_run
    merged = run.main(
        [
            "--from-results",
            str(out / "run.json"),
            str(out / "run.json"),
            "--summary",
            str(tmp_path / "s.json"),
        ]
    )
    assert merged["summary"] == json.loads(json.dumps(result["summary"]))


@pytest.mark.slow
def test_merge_replaces_a_shape_measured_again(small_run, tmp_path):
    """A later file that measured a shape again (here only its bf16 rows) replaces every
    row of that shape, so no recipe is compared with another run's bf16; the other
    shapes keep the earlier file's rows."""
    out, _ = small_run
    first = json.loads((out / "run.json").read_text())
    sweep = first["sections"]["sweep"]["rows"]
    again = [dict(r, ms=r["ms"] * 2) for r in sweep if r["M"] == 16 and r["impl"] == "bf16"]
    later = {
        "meta": first["meta"],
        "sections": {"sweep": dict(first["sections"]["sweep"], rows=again)},
    }
    (tmp_path / "later.json").write_text(json.dumps(later))
    merged = run.merge([out / "run.json", tmp_path / "later.json"])
    rows = merged["sections"]["sweep"]["rows"]
    assert [r for r in rows if r["M"] == 16] == again
    assert [r for r in rows if r["M"] != 16] == [r for r in sweep if r["M"] != 16]
    assert merged["sections"]["linear"]["rows"] == first["sections"]["linear"]["rows"]


@pytest.mark.slow
def test_merged_summary_takes_a_recipe_measured_again_over_its_own_bf16(small_run, tmp_path):
    """A later run of one recipe at a shape, with its own bf16 rows, replaces that
    recipe's ratios there, each over the later bf16; the other recipes keep theirs."""
    out, result = small_run
    first = json.loads((out / "run.json").read_text())
    linear = first["sections"]["linear"]["rows"]
    shape = (linear[0]["M"], linear[0]["K"], linear[0]["N"])
    again = [
        dict(r, ms=r["ms"] * 2) if r["impl"] == "bf16" else r
        for r in linear
        if (r["M"], r["K"], r["N"]) == shape and r["recipe"] in ("bf16", "float8_rowwise")
    ]
    later = {
        "meta": first["meta"],
        "sections": {"linear": dict(first["sections"]["linear"], rows=again)},
    }
    (tmp_path / "later.json").write_text(json.dumps(later))
    merged = run.merge([out / "run.json", tmp_path / "later.json"])["summary"]
    before = json.loads(json.dumps(result["summary"]))["linear_fwd_bwd_speedup_vs_bf16"]
    after = merged["linear_fwd_bwd_speedup_vs_bf16"]
    key = summary.shape_key({"M": shape[0], "K": shape[1], "N": shape[2]})
    assert after["float8_rowwise"][key]["eager"] == pytest.approx(
        2 * before["float8_rowwise"][key]["eager"],
        abs=2e-3,  # ratios keep 3 decimals
    )
    others = {r: v for r, v in before.items() if r != "float8_rowwise"}
    assert others and {r: after[r] for r in others} == others


@pytest.mark.slow
def test_a_failing_item_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    real = linear_step.make_layer

    def make_layer(impl, recipe, weight):
        if impl == "lowp":
            raise RuntimeError("planted")
        return real(impl, recipe, weight)

    monkeypatch.setattr(linear_step, "make_layer", make_layer)
    result = run.main(
        [
            "--small",
            "--sections",
            "sweep",
            "--recipes",
            "float8_tensorwise",
            "--out",
            str(tmp_path / "run.json"),
        ]
    )
    sweep = result["sections"]["sweep"]
    assert [r["impl"] for r in sweep["rows"]] == ["bf16", "bf16_control"] * 2
    assert [e["error"] for e in sweep["errors"]] == ["RuntimeError: planted"] * 2
    assert result["summary"]["incomplete"] == {"sweep": {"skipped": 0, "errors": 2}}


@pytest.mark.slow
def test_a_failing_jax_variant_is_recorded_and_the_others_are_timed(tmp_path, monkeypatch):
    pytest.importorskip("flax")
    from bench import jax_training

    real = jax_training.compile_step

    def compile_step(impl, recipe, tensors):
        if impl == "flax_fp8":
            raise RuntimeError("planted")
        return real(impl, recipe, tensors)

    monkeypatch.setattr(jax_training, "compile_step", compile_step)
    argv = ["--small", "--sections", "jax", "--recipes", "float8_tensorwise"]
    result = run.main(argv + ["--out", str(tmp_path / "run.json")])
    jax_section = result["sections"]["jax"]
    assert [r["impl"] for r in jax_section["rows"]] == ["bf16", "lowp"]
    assert jax_section["rows"][0]["timed_with"] == ["lowp float8_tensorwise"]
    assert [e["item"] for e in jax_section["errors"]] == ["64x128x256 flax_fp8 "]
    assert [e["error"] for e in jax_section["errors"]] == ["RuntimeError: planted"]


@pytest.mark.slow
def test_a_spent_time_budget_skips_and_says_so(tmp_path):
    result = run.main(
        [
            "--small",
            "--sections",
            "linear",
            "--time-budget",
            "-1",
            "--out",
            str(tmp_path / "run.json"),
        ]
    )
    linear = result["sections"]["linear"]
    assert linear["rows"] == [] and linear["skipped"]
    assert all(s["why"].startswith("time budget") for s in linear["skipped"])
    assert result["summary"]["linear_fwd_bwd_speedup_vs_bf16"] == {}


@pytest.mark.slow
def test_jax_section(tmp_path):
    pytest.importorskip("flax")
    result = run.main(
        [
            "--small",
            "--sections",
            "jax",
            "--recipes",
            "float8_tensorwise",
            "--out",
            str(tmp_path / "run.json"),
        ]
    )
    jax_rows = result["sections"]["jax"]["rows"]
    assert [r["impl"] for r in jax_rows] == ["bf16", "flax_fp8", "lowp"]
    speedups = result["summary"]["jax_dense_fwd_bwd_speedup_vs_bf16"]
    assert set(speedups) == {"flax_fp8", "float8_tensorwise"}


def test_interleaved_timing_shuffles_the_variants_through_each_round():
    """Each callable: its warm-up (iterations fixed: no sizing call), then one repeat a
    round, in an order shuffled each round, so that a callable does not always follow
    the same one; one Measured each, in the given order."""
    calls = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    timing = _timing.Timing(warmup=2, repeats=6, iters=4)
    measured = _timing.time_interleaved(fns, lambda: None, timing)
    assert [m.iters for m in measured] == [4, 4, 4]
    assert all(m.ms >= 0 and m.warmup_s >= 0 for m in measured)
    warm, timed = calls[:6], calls[6:]
    assert warm == ["a", "a", "b", "b", "c", "c"]
    rounds = [timed[i : i + 12] for i in range(0, 72, 12)]
    assert all(r == [x for x in r[::4] for _ in range(4)] for r in rounds)
    orders = ["".join(r[::4]) for r in rounds]
    assert all(sorted(order) == list("abc") for order in orders)
    before_a = {order[order.index("a") - 1] for order in orders if order[0] != "a"}
    assert before_a == {"b", "c"}, orders  # rotating would give "a" one predecessor
    assert _timing.time_interleaved(fns, lambda: None, timing) and calls[-72:] == timed  # seeded


def test_same_iters_gives_every_callable_the_largest_count(monkeypatch):
    """Sized one by one, a launch-bound call's count varies with the one call that sizes
    it; same_iters runs every callable the largest count."""
    counts = iter([3, 7, 5])
    monkeypatch.setattr(_timing, "_iters_for_target", lambda fn, sync, timing: next(counts))
    fns = [lambda: None] * 3
    timing = _timing.Timing(warmup=1, repeats=2, target_s=0.01)
    assert [m.iters for m in _timing.time_interleaved(fns, lambda: None, timing, True)] == [7] * 3
    counts = iter([3, 7, 5])
    assert [m.iters for m in _timing.time_interleaved(fns, lambda: None, timing)] == [3, 7, 5]


@pytest.mark.slow
def test_the_sweep_times_bf16_and_the_recipes_together(small_run):
    """Every sweep row names the variants it was timed beside (one item per shape)."""
    out, _ = small_run
    sweep = json.loads((out / "run.json").read_text())["sections"]["sweep"]["rows"]
    for row in sweep:
        others = {
            (r["impl"], r["recipe"]) for r in sweep if (r["M"], r["K"]) == (row["M"], row["K"])
        }
        others.discard((row["impl"], row["recipe"]))
        assert sorted(row["timed_with"]) == sorted(f"{i} {r}" for i, r in others)


@pytest.mark.slow
def test_host_overhead_bench_times_the_fallback_and_its_parts(tmp_path):
    """bench/probes/host_overhead.py on this CPU (the kernel check faked, then restored): every
    variant is timed and written out, and --profile reports the step's events and Python
    calls of bf16 and lowp. (No timing is asserted: that is the GPU's run.)"""
    from bench.probes import host_overhead
    from lowp_torch import _training

    real = _training.fp8_kernels_run
    result = host_overhead.main(
        ["--k", "32", "--repeats", "3", "--iters", "50", "--profile"]
        + ["--out", str(tmp_path / "h.json")]
    )
    assert _training.fp8_kernels_run is real
    us = result["us"]
    assert set(us) == {
        "step bf16",
        "step bf16 #2",
        "step bf16, +5 us",
        "step bf16, +policy",
        "step lowp",
        "step lowp, F.linear",
        "fwd bf16",
        "fwd lowp",
    }
    assert all(v > 0 for v in us.values())
    written = json.loads((tmp_path / "h.json").read_text())
    assert written["us"] == us
    report = written["profile"]
    assert "aten::mm" in report  # the GEMMs, counted in both steps
    assert "# cProfile, step lowp, 300 steps" in report and "function calls" in report


def test_host_overhead_handoff_times_forward_and_backward_apart_at_each_gap(tmp_path):
    """--handoff: every gap of both graphs, then lowp's step and the second bf16 layer,
    each with its per-call forward and backward() times; the gap is on neither clock (64 us
    of busy-waiting does not reach the engine graph's forward, a view), and the host's
    idle-state facts are recorded beside them."""
    from bench.probes import host_overhead

    result = host_overhead.main(
        ["--k", "32", "--repeats", "1", "--iters", "20", "--handoff", "--handoff-rounds", "2"]
        + ["--out", str(tmp_path / "h.json")]
    )
    handoff = json.loads((tmp_path / "h.json").read_text())["handoff"]
    assert handoff == result["handoff"]
    gaps = host_overhead.GAPS_US
    assert list(handoff) == [f"engine, gap {d} us" for d in gaps] + [
        f"bf16, gap {d} us" for d in gaps
    ] + ["lowp, gap 0 us", "bf16 #2, gap 0 us"]
    for r in handoff.values():
        assert 0 < r["fwd_median"] and 0 < r["bwd_median"] <= r["step_mean"] * 10
        assert r["step_mean"] > r["bwd_mean"]
    assert handoff["engine, gap 64 us"]["fwd_median"] < 64
    assert set(result["host"]) == {
        "cpus",
        "hypervisor",
        "cpuidle_driver",
        "cpuidle_governor",
        "guest_halt_poll_ns",
    }


def test_host_overhead_bench_refuses_a_shape_outside_the_fallback(monkeypatch):
    from bench.probes import host_overhead
    from lowp import extend

    monkeypatch.setattr(extend, "call_pays", lambda *a: True)
    with pytest.raises(ValueError, match="16x32x32 with float8_tensorwise is not in the"):
        host_overhead.main(["--k", "32", "--repeats", "1", "--iters", "1"])


@pytest.mark.slow
def test_model_sections(tmp_path):
    """The model slice trains and serves in every CPU variant (torchao's are CUDA-only),
    and the summary gives each a ratio per T and mode."""
    argv = ["--small", "--sections", "model_train,model_infer", "--out", str(tmp_path / "m.json")]
    result = run.main(argv)
    for name in ("model_train", "model_infer"):
        section = result["sections"][name]
        assert not section["errors"] and not section["skipped"], section
    train = result["summary"]["model_train_speedup_vs_bf16"]["torch"]
    assert set(train) == {"32"}
    assert set(train["32"]) == {"lowp_float8_tensorwise", "lowp_float8_rowwise"}
    assert all(set(cell) == {"eager"} and cell["eager"] > 0 for cell in train["32"].values())
    infer = result["summary"]["model_infer_speedup_vs_bf16"]["torch"]
    assert set(infer) == {"1", "16"}


@pytest.mark.slow
def test_jax_model_sections(tmp_path):
    """The slice in flax linen trains (bf16, flax's fp8, lowp) and serves (bf16, lowp) on
    the CPU, and the summary files the ratios under "jax"."""
    pytest.importorskip("flax")
    argv = ["--small", "--sections", "jax_model_train,jax_model_infer"]
    result = run.main([*argv, "--out", str(tmp_path / "m.json")])
    for name in ("jax_model_train", "jax_model_infer"):
        section = result["sections"][name]
        assert not section["errors"] and not section["skipped"], section
    train = result["summary"]["model_train_speedup_vs_bf16"]
    assert set(train) == {"jax"}
    assert set(train["jax"]["32"]) == {"flax_fp8", "lowp_float8_tensorwise", "lowp_float8_rowwise"}
    assert all(set(cell) == {"jit"} for cell in train["jax"]["32"].values())
    infer = result["summary"]["model_infer_speedup_vs_bf16"]["jax"]
    assert set(infer) == {"1", "16"}
    assert set(result["summary"]["model_train_compile_s"]["jax"]["32"]) == {
        "bf16",
        "flax_fp8",
        "lowp_float8_tensorwise",
        "lowp_float8_rowwise",
    }
