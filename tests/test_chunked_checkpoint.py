"""lowp_apps.checkpoint: a sharded bf16 checkpoint quantized shard by shard, each linear
weight to the bytes `lowp.quantize` gives it, one shard read at a time."""

import json

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp_apps import checkpoint


def _shards(root):
    rng = np.random.default_rng(0)

    def bf16(*shape):
        return rng.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16)

    contents = {
        "model-00001-of-00003.safetensors": {
            "embed_tokens.weight": bf16(64, 32),
            "l0.weight": bf16(32, 64),
        },
        "model-00002-of-00003.safetensors": {
            "l1.experts": bf16(2, 16, 32),
            "l1.norm.weight": bf16(32),
        },
        "model-00003-of-00003.safetensors": {"head.weight": bf16(8, 64), "step": np.arange(3)},
    }
    for name, arrays in contents.items():
        lowp.save(root / name, arrays)
    index = {"weight_map": {t: s for s, arrays in contents.items() for t in arrays}}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return contents


@pytest.mark.parametrize(
    "scheme", [lowp.MXScaling(), lowp.NVFP4Scaling(), lowp.AxisScaling()], ids=str
)
def test_each_shard_becomes_a_lowp_file_of_quantized_tensors(tmp_path, scheme, monkeypatch):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    contents = _shards(src)
    events = []
    read, save = lowp.read_arrays, lowp.save
    monkeypatch.setattr(lowp, "read_arrays", lambda p: events.append(("read", p.name)) or read(p))
    monkeypatch.setattr(lowp, "save", lambda p, t: events.append(("save", p.name)) or save(p, t))

    done = checkpoint.quantize_checkpoint(src, out, scheme)

    # one shard at a time: each is read, then written, before the next is read
    names = sorted(contents)
    assert events == [(what, name) for name in names for what in ("read", "save")]
    assert [d["shard"] for d in done] == names
    for name, arrays in contents.items():
        loaded = lowp.load(out / name)
        assert sorted(loaded) == sorted(arrays)
        for tensor, source in arrays.items():
            got = loaded[tensor]
            # the linear weights are quantized; an embedding table, a rank-3 tensor, a
            # norm's weight and an integer step are not
            kept = {"embed_tokens.weight", "l1.experts", "l1.norm.weight", "step"}
            if tensor not in kept:
                want = lowp.quantize(source, scheme)
                assert isinstance(got, lowp.QTensor)
                assert got.codes.tobytes() == want.codes.tobytes()
                assert got.scale.tobytes() == want.scale.tobytes()
            else:
                assert isinstance(got, np.ndarray) and got.dtype == source.dtype
                assert got.tobytes() == source.tobytes()
    assert (out / "model.safetensors.index.json").read_text() == (
        src / "model.safetensors.index.json"
    ).read_text()


def test_a_linear_weight_the_scheme_refuses_is_named_not_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lowp.save(src / "model.safetensors", {"head.weight": np.ones((8, 48), np.float32)})
    with pytest.raises(ValueError, match=r"model\.safetensors: head\.weight"):
        checkpoint.quantize_checkpoint(src, tmp_path / "out", lowp.MXScaling())


def test_a_directory_without_shards_is_named(tmp_path):
    with pytest.raises(ValueError, match="no .safetensors shard"):
        checkpoint.quantize_checkpoint(tmp_path, tmp_path / "out", lowp.MXScaling())
