"""`lowp convert`, `lowp inspect`'s dialect lines, and checkpoint directories lowp.load refuses or reads (NumPy only)."""

import json

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp_apps import cli


@pytest.fixture
def float_file(tmp_path):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 128)) * 0.05).astype(ml_dtypes.bfloat16)
    path = tmp_path / "float.safetensors"
    lowp.save(path, {"fc.weight": w, "fc.bias": np.zeros(64, np.float32)})
    return path, w


def test_convert_quantizes_with_the_producer_rule_and_inspect_names_the_dialect(
    tmp_path, float_file, capsys
):
    src, w = float_file
    dst = tmp_path / "ct"
    assert (
        cli.main(
            ["convert", str(src), str(dst), "--to", "compressed-tensors", "--quantize", "axis"]
        )
        == 0
    )
    config = json.loads((dst / "config.json").read_text())["quantization_config"]
    assert config["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
    q = lowp.load(dst)["fc.weight"]
    expected = lowp.checkpoints.quantize_like(w, lowp.AxisScaling(axis=-1), "compressed-tensors")
    np.testing.assert_array_equal(q.codes, expected.codes)
    np.testing.assert_array_equal(q.scale, expected.scale)

    capsys.readouterr()
    assert cli.main(["inspect", str(dst), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "fc.weight: compressed-tensors, axis:" in out
    assert "producer rule gives the bytes back: yes (compressed-tensors)" in out


@pytest.mark.parametrize(
    ("target", "spec", "scheme"),
    [
        ("modelopt", "tensor", lowp.TensorScaling()),
        ("modelopt", "axis", lowp.AxisScaling(axis=-1)),
        ("hf-fp8", "block:block=64x128", lowp.BlockScaling(block=(64, 128))),
    ],
)
def test_convert_quantizes_with_each_producers_rule(
    tmp_path, float_file, capsys, target, spec, scheme
):
    src, w = float_file
    dst = tmp_path / target
    assert cli.main(["convert", str(src), str(dst), "--to", target, "--quantize", spec]) == 0
    q = lowp.load(dst)["fc.weight"]
    expected = lowp.checkpoints.quantize_like(w, scheme, target)
    np.testing.assert_array_equal(q.codes, expected.codes)
    np.testing.assert_array_equal(q.scale, expected.scale)
    capsys.readouterr()
    assert cli.main(["inspect", str(dst), "--no-progress"]) == 0
    assert f"fc.weight: {target}," in capsys.readouterr().out


@pytest.mark.parametrize("target", ["hf-fp8", "modelopt", "lowp"])
def test_convert_between_dialects_keeps_the_bytes(tmp_path, float_file, target):
    src, _ = float_file
    scheme = "block:block=128x128" if target == "hf-fp8" else "tensor"
    assert (
        cli.main(
            [
                "convert",
                str(src),
                str(tmp_path / "ct"),
                "--to",
                "compressed-tensors",
                "--quantize",
                scheme,
            ]
        )
        == 0
    )
    dst = tmp_path / ("out.safetensors" if target == "lowp" else "out")
    assert cli.main(["convert", str(tmp_path / "ct"), str(dst), "--to", target]) == 0
    before, after = lowp.load(tmp_path / "ct")["fc.weight"], lowp.load(dst)["fc.weight"]
    np.testing.assert_array_equal(after.codes, before.codes)
    np.testing.assert_array_equal(after.scale, before.scale)
    assert after.scheme == before.scheme


def test_convert_refuses_a_scheme_the_dialect_cannot_store(tmp_path, float_file, capsys):
    src, _ = float_file
    assert (
        cli.main(
            ["convert", str(src), str(tmp_path / "g"), "--to", "gpt-oss", "--quantize", "tensor"]
        )
        == 2
    )
    assert "'fc.weight'" in capsys.readouterr().err


def test_a_directory_of_lowp_files_loads_their_qtensors(tmp_path):
    q = lowp.quantize(np.ones((2, 32), np.float32), lowp.MXScaling())
    (tmp_path / "d").mkdir()
    lowp.save(tmp_path / "d" / "model.safetensors", {"w": q, "b": np.zeros(2, np.float32)})
    loaded = lowp.load(tmp_path / "d")
    assert sorted(loaded) == ["b", "w"] and loaded["w"].scheme == q.scheme
    assert loaded["w"].origin is None


@pytest.mark.parametrize(
    ("quantization_config", "message"),
    [
        ([1, 2], "quantization_config must be a JSON object"),
        (
            {"quant_method": "compressed-tensors", "format": "pack-quantized"},
            "format 'pack-quantized'",
        ),
        (
            {"quant_method": "compressed-tensors", "format": "float-quantized"},
            "needs 'config_groups'",
        ),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo 'W4A8_AWQ'"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two"),
        ({"quant_method": "fp8", "scale_fmt": "e5m2"}, "scale_fmt 'e5m2'"),
    ],
)
def test_a_configuration_lowp_cannot_read_is_refused_naming_it(
    tmp_path, quantization_config, message
):
    lowp.save(tmp_path / "model.safetensors", {"x": np.zeros(2, np.float32)})
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": quantization_config}))
    with pytest.raises(ValueError, match=message):
        lowp.load(tmp_path)
