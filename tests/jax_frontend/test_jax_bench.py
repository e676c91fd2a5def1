"""bench/jax_dense.py runs (tiny, on whatever backend) and writes its JSON."""

import importlib.util
import json
import pathlib

import pytest

pytest.importorskip("flax")

_BENCH = pathlib.Path(__file__).parents[2] / "bench" / "jax_dense.py"


def test_small_run_writes_rows(tmp_path):
    spec = importlib.util.spec_from_file_location("jax_dense", _BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
