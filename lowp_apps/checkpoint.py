"""Quantize a sharded safetensors checkpoint on the CPU, one shard at a time.

Each `*.safetensors` shard of the source directory becomes a lowp file of the same name
in the output directory: every floating-point tensor of rank >= 2 that the scheme admits
is quantized with the NumPy reference (`lowp.quantize`, which works a slab of rows at a
time), everything else is kept as it is. Only one shard is in memory at a time, and each
source tensor is dropped once quantized, so the peak is about one shard plus its output:
a 7B-parameter bf16 checkpoint converts on a machine with far less memory than 14 GB
(docs/performance.md, CPU path, gives the measured run).

    >>> import tempfile, numpy as np, lowp
    >>> src, out = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> lowp.save(f"{src}/model-00001-of-00001.safetensors",
    ...           {"w": np.ones((4, 32), np.float32), "norm": np.ones(4, np.float32)})
    >>> [r["quantized"] for r in quantize_checkpoint(src, out, lowp.MXScaling())]
    [1]
    >>> sorted(lowp.load(f"{out}/model-00001-of-00001.safetensors"))
    ['norm', 'w']
"""

import pathlib
import shutil

import numpy as np

import lowp

_FLOATING = ("float32", "bfloat16", "float16")


def shards(src) -> list[pathlib.Path]:
    """The `.safetensors` files of directory `src`, by name; ValueError if there are none."""
    found = sorted(pathlib.Path(src).glob("*.safetensors"))
    if not found:
        raise ValueError(f"{src}: no .safetensors shard in this directory")
    return found


def _quantizable(array: np.ndarray, scheme) -> bool:
    if array.ndim < 2 or array.dtype.name not in _FLOATING:
        return False
    try:
        scheme.check_shape(array.shape)
    except ValueError:
        return False
    return True


def quantize_shard(path, out_path, scheme) -> dict:
    """Quantize one shard into the lowp file `out_path`; returns what was done."""
    arrays = lowp.read_arrays(path)
    written: dict = {}
    quantized = 0
    for name in list(arrays):
        array = arrays.pop(name)  # drop the source tensor once its output exists
        if _quantizable(array, scheme):
            written[name] = lowp.quantize(array, scheme, name=name)
            quantized += 1
        else:
            written[name] = array
    lowp.save(out_path, written)
    return {"shard": pathlib.Path(path).name, "tensors": len(written), "quantized": quantized}


def quantize_checkpoint(src, out, scheme) -> list[dict]:
    """Quantize every shard of directory `src` into directory `out` (created), shard by
    shard; a `*.index.json` beside the shards is copied (the tensor names stay)."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done = [quantize_shard(path, out / path.name, scheme) for path in shards(src)]
    for index in pathlib.Path(src).glob("*.index.json"):
        shutil.copy(index, out / index.name)
    return done
