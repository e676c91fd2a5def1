"""bench/probes/jax_dense.py and bench/probes/jax_cast.py run (tiny, on whatever backend) and write their JSON."""

import importlib.util
import json
import pathlib

import pytest

pytest.importorskip("flax")
jax = pytest.importorskip("jax")

from lowp_jax import _devices  # after the skip: jax may be missing


def _bench(name: str):
    """bench/probes/NAME.py, or the harness's bench/NAME.py, as a module (bench/ is no
    package on the test path)."""
    bench = pathlib.Path(__file__).parents[2] / "bench"
    path = bench / "probes" / f"{name}.py"
    if not path.exists():
        path = bench / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_run_writes_rows(tmp_path):
    bench = _bench("jax_dense")
    out = tmp_path / "dense.json"
    bench.main(["--small", "--presets", "float8_rowwise", "--iters", "1", "--out", str(out)])
    result = json.loads(out.read_text())
    parts = [(r["preset"], r["part"]) for r in result["rows"]]
    assert parts == [
        ("bf16", "dense"),
        ("e4m3 codes", "raw gemm"),
        ("float8_rowwise", "dense"),
        ("float8_rowwise", "gemm"),
        ("float8_rowwise", "quantize"),
    ]
    assert all(r["ms"] > 0 and r["M"] == 256 for r in result["rows"])


@pytest.mark.slow
def test_small_cast_run_checks_bytes_and_writes_rows(tmp_path):
    """The cast bench's paths write the same bytes, and its edge cases are lowp's."""
    bench = _bench("jax_cast")
    out = tmp_path / "cast.json"
    assert bench.main(["--small", "--iters", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["edges"]) == 24 and all(e["equal"] for e in result["edges"])
    paths = [(r["scheme"], r["path"]) for r in result["speed"]]
    assert paths == [
        ("tensorwise", "pallas"),
        ("tensorwise", "xla"),
        ("rowwise", "pallas"),
        ("rowwise", "xla"),
        ("rowwise_of_transpose", "pallas_xT"),
        ("rowwise_of_transpose", "xla_xT"),
        ("rowwise_of_transpose", "axis0_codesT"),
        ("rowwise_of_transpose", "transposed_kernel"),
    ]
    compared = [r for r in result["speed"] if "same_bytes_as_pallas" in r]
    assert len(compared) == 3 and all(r["same_bytes_as_pallas"] for r in compared)


@pytest.mark.slow
def test_fp8_pattern_bench_runs_its_variants(capsys):
    """bench/probes/jax_fp8_pattern.py: lowp's forms agree with themselves bit for bit; a form
    the backend refuses (a named fp8 dot algorithm on the CPU) is reported, not fatal."""
    bench = _bench("jax_fp8_pattern")
    bench.main(["64", "--variants", "a,g,h,rows_a"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert set(lines) == {"bf16", "quantize", "a", "g", "h", "rows_a"}
    assert "maxdiff_vs_a=0 equal=True" in lines["a"]
    assert "maxdiff_vs_rows_a=0 equal=True" in lines["rows_a"]
    assert "gemm=" in lines["g"] and "maxdiff_vs_a=" in lines["g"]
    if jax.default_backend() == "cpu":
        assert "not run: ValueError" in lines["h"], lines["h"]


def test_step_parts_trace_sums_a_steps_device_events():
    """--trace's summary on a hand-made Perfetto trace: only the device processes' events
    count, per thread a step (summed, their union, first start to last end), and the
    kernels by time a step."""
    bench = _bench("jax_step_parts")
    trace = {
        "traceEvents": [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 2, "tid": 7, "name": "thread_name", "args": {"name": "Stream #1"}},
            {"ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 500, "name": "host work"},
            # two steps: gemm [0, 10) and cast [5, 12) overlap; then gemm [20, 30)
            {"ph": "X", "pid": 2, "tid": 7, "ts": 0, "dur": 10, "name": "gemm"},
            {"ph": "X", "pid": 2, "tid": 7, "ts": 5, "dur": 7, "name": "cast"},
            {"ph": "X", "pid": 2, "tid": 7, "ts": 20, "dur": 10, "name": "gemm"},
        ]
    }
    events = bench.device_events(trace)
    assert events == {"Stream #1": [("gemm", 0.0, 10.0), ("cast", 5.0, 7.0), ("gemm", 20.0, 10.0)]}
    summary = bench.summarize_trace(events, steps=2)
    assert summary["threads"] == {
        "Stream #1": {"events": 1.5, "sum_us": 13.5, "busy_us": 11.0, "span_us": 15.0}
    }
    assert summary["kernels"] == [
        {"thread": "Stream #1", "name": "gemm", "us": 10.0, "count": 1.0},
        {"thread": "Stream #1", "name": "cast", "us": 3.5, "count": 0.5},
    ]
    assert bench.busy_us([(0, 4), (1, 2), (10, 1)]) == 5.0


@pytest.mark.slow
def test_step_parts_trace_runs_each_step_under_the_profiler(tmp_path):
    """--trace writes a row per step (bf16, flax's, each recipe), with no timing; a CPU
    trace has no device process, so its summary is empty there."""
    bench = _bench("jax_step_parts")
    out = tmp_path / "trace.json"
    bench.main(
        ["--trace", "--shapes", "64x128x96", "--recipes", "float8_rowwise"] + ["--out", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["bf16", "flax_fp8", "float8_rowwise"]
    on_gpu = jax.default_backend() == "gpu"
    for row in rows:
        assert bool(row["threads"]) == on_gpu and bool(row["kernels"]) == on_gpu


def test_gemm_form_probe_compiles_the_form_and_restores_the_threshold():
    """bench/probes/jax_gemm_form.py at one small shape: a line per precision saying what the
    compiled module runs (no cuBLASLt GEMM off the GPU), the threshold put back after."""
    from lowp_jax import _dot

    bench = _bench("jax_gemm_form")
    lines = bench.main(["64x128x96"])
    assert [line.split(":")[0] for line in lines] == [
        "64x128x96 2^19 DEFAULT",
        "64x128x96 2^19 HIGHEST",
    ]
    on_gpu = jax.default_backend() == "gpu"
    assert all("cublasLt-fp8->" in line for line in lines)
    assert on_gpu or all("cublasLt-fp8->[]" in line for line in lines)
    assert _dot._GEMM_OUTPUT.value == ("auto", _dot.BF16_OUTPUT_MIN_MACS)


@pytest.mark.slow
def test_gemm_accuracy_measures_every_path_on_every_kind_of_data(tmp_path):
    """bench/probes/gemm_accuracy.py at one small shape: a row per kind of data with every
    path's SQNR, each within spec §7's 40 dB at this K (256) even under fast
    accumulation (on the H200 its loss on same-signed products left 53 dB there,
    bench/results/2026-11-30_7f48d84_gemm_accuracy.json). Off the GPU there is no fast
    accumulation: fast and split are one dot, and a float32 output is far past bf16's
    floor; the bfloat16-rounded scale costs at most 10 dB of it. Bad data names are
    refused."""
    bench = _bench("gemm_accuracy")
    out = tmp_path / "accuracy.json"
    result = bench.main(["--shapes", "64x256x128", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = result["sqnr_db"]
    assert [r["data"] for r in rows] == list(bench.DATA)
    jax_paths = [
        "jax_fast_f32",
        "jax_fast_bf16",
        "jax_split_f32",
        "jax_split_bf16",
        "jax_fast_bf16_scalar",
    ]
    for row in rows:
        assert set(jax_paths) <= set(row)
        paths = [p for p in row if p.startswith(("jax_", "torch_")) and p != "jax_off_cublaslt"]
        assert min(row[p] for p in paths) >= 40, row
        if jax.default_backend() == "cpu":
            assert row["jax_fast_bf16"] == row["jax_split_bf16"] == row["bf16_rounding"]
            assert row["jax_split_f32"] > 100
            assert row["jax_fast_bf16_scalar"] >= row["bf16_rounding"] - 10
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "64x256x128", "--data", "positive"])


@pytest.mark.slow
def test_step_parts_steps_merge_into_the_targets_summary(tmp_path):
    """--run-out writes the default steps (no parts, no variants) as a run.py "jax"
    section, which `run.py --from-results` turns into the summary's JAX ratios."""
    bench = _bench("jax_step_parts")
    run_out = tmp_path / "run.json"
    bench.main(
        ["--shapes", "64x128x96", "--recipes", "float8_tensorwise", "--variants", "f32_out"]
        + ["--no-parts", "--repeats", "1", "--run-out", str(run_out)]
    )
    rows = json.loads(run_out.read_text())["sections"]["jax"]["rows"]
    assert [(r["impl"], r["recipe"]) for r in rows] == [
        ("bf16", "bf16"),
        ("flax_fp8", "flax_fp8"),
        ("lowp", "float8_tensorwise"),
    ]
    assert rows[2]["timed_with"] == ["bf16", "flax_fp8"]
    run = _bench("run")
    merged = run.merge([run_out])
    table = merged["summary"]["jax_dense_fwd_bwd_speedup_vs_bf16"]
    assert set(table) == {"flax_fp8", "float8_tensorwise"}
    bf16 = rows[0]["ms"]
    assert table["float8_tensorwise"]["64x128x96"] == pytest.approx(bf16 / rows[2]["ms"], rel=1e-2)


@pytest.mark.slow
def test_step_parts_bench_takes_the_step_apart(tmp_path):
    """bench/probes/jax_step_parts.py: every part is timed, and its GEMMs on the operands of
    `training_operands` reproduce the step's y, dx and dw bit for bit, so the parts
    are the step's own pieces."""
    bench = _bench("jax_step_parts")
    out = tmp_path / "parts.json"
    bench.main(
        [
            "--shapes",
            "64x128x96",
            "--recipes",
            "float8_tensorwise,float8_rowwise,float8_rowwise_gw_hp",
            "--variants",
            "xT_copy",
            "--repeats",
            "1",
            "--out",
            str(out),
        ]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["recipe"], r["part"]) for r in rows] == [
        ("bf16", "step"),
        ("flax_fp8", "step"),
        ("float8_tensorwise", "step"),
        ("float8_tensorwise", "casts"),
        ("float8_tensorwise", "gemms"),
        ("float8_tensorwise", "raw"),
        ("float8_rowwise", "step"),
        ("float8_rowwise", "casts"),
        ("float8_rowwise", "gemms"),
        ("float8_rowwise", "raw"),
        ("float8_rowwise (xT_copy)", "step"),
        ("float8_rowwise_gw_hp", "step"),
        ("float8_rowwise_gw_hp", "casts"),
        ("float8_rowwise_gw_hp", "gemms"),
        ("float8_rowwise_gw_hp", "raw"),
    ]
    assert all(r["ms"] > 0 for r in rows)
    # cuBLASLt fp8 GEMMs in each compiled step: none on the CPU or for bf16. On a GPU
    # XLA may give dots this small to a Triton GEMM (the H200 did), so the count there is
    # only bounded (at the LLM shapes it is 3, 3 and 2); the variant changes casts, never
    # the GEMMs.
    steps = {r["recipe"]: r for r in rows if r["part"] == "step"}
    gemms = {recipe: r["fp8_gemms_in_hlo"] for recipe, r in steps.items()}
    on_gpu = jax.default_backend() == "gpu"
    assert gemms["bf16"] == 0
    assert max(gemms["float8_tensorwise"], gemms["float8_rowwise"]) <= 3
    assert gemms["float8_rowwise_gw_hp"] <= 2
    assert on_gpu or set(gemms.values()) == {0}
    assert gemms["float8_rowwise (xT_copy)"] == gemms["float8_rowwise"]
    # The transposed cast kernel on an sm_90 GPU: rowwise's x.T, w.T and dy.T. Tensorwise
    # transposes its forward codes, rowwise_gw_hp's one transposed operand (the dgrad's
    # w) is tensorwise; never with the xT_copy switch or off such a GPU.
    kernels = {recipe: r["transposed_cast_kernels"] for recipe, r in steps.items()}
    on_sm90 = _devices.sm90_gpus()
    assert kernels == {
        "bf16": 0,
        "flax_fp8": 0,
        "float8_tensorwise": 0,
        "float8_rowwise": 3 if on_sm90 else 0,
        "float8_rowwise (xT_copy)": 0,
        "float8_rowwise_gw_hp": 0,
    }
    # bit for bit off the GPU; on one, the step and the part are compiled apart and the
    # autotuner may give one of them another GEMM kernel (`gemms_match_step`)
    steps = {r["recipe"]: r["gemms_match_step"] for r in rows if "gemms_match_step" in r}
    assert {recipe: sorted(gemms) for recipe, gemms in steps.items()} == {
        "float8_tensorwise": ["dgrad", "forward", "wgrad"],
        "float8_rowwise": ["dgrad", "forward", "wgrad"],
        "float8_rowwise_gw_hp": ["dgrad", "forward"],
    }
    for recipe, gemms in steps.items():
        for gemm, (bitwise, sqnr_db) in gemms.items():
            assert (bitwise and sqnr_db == float("inf")) if not on_gpu else sqnr_db >= 40, (
                recipe,
                gemm,
                bitwise,
                sqnr_db,
            )
