"""Quantize a sharded safetensors checkpoint on the CPU, one shard at a time.

Each `*.safetensors` shard of the source directory becomes a lowp file of the same name
in the output directory: every float linear weight (`linear_weights`: rank 2, named
`*weight`, not an embedding table; the tensors `quantize_` would quantize) is quantized
with the NumPy reference (`lowp.quantize`, which works a slab of rows at a time), every
other tensor is kept as it is. A linear weight the scheme cannot take (MX blocks that do
not divide its rows, say) is an error naming it, not a tensor silently kept. Only one shard is in memory at a time, and each
source tensor is dropped once quantized, so the peak is about one shard plus its output:
a 7B-parameter bf16 checkpoint converts on a machine with far less memory than 14 GB
(docs/performance.md, CPU path, gives the measured run).

    >>> import tempfile, numpy as np, lowp
    >>> src, out = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> lowp.save(f"{src}/model-00001-of-00001.safetensors",
    ...           {"fc.weight": np.ones((4, 32), np.float32), "norm.weight": np.ones(4, np.float32)})
    >>> [r["quantized"] for r in quantize_checkpoint(src, out, lowp.MXScaling())]
    [1]
    >>> sorted(lowp.load(f"{out}/model-00001-of-00001.safetensors"))
    ['fc.weight', 'norm.weight']
"""

import pathlib
import shutil

import lowp
from lowp_apps import linear_weights


def shards(src) -> list[pathlib.Path]:
    """The `.safetensors` files of directory `src`, by name; ValueError if there are none."""
    found = sorted(pathlib.Path(src).glob("*.safetensors"))
    if not found:
        raise ValueError(f"{src}: no .safetensors shard in this directory")
    return found


def quantize_linear_weights(tensors: dict, scheme, rule=None) -> tuple[dict, int]:
    """Each float linear weight of `tensors` (`linear_weights`: rank 2, named `*weight`,
    not an embedding table) quantized with `scheme`, every other tensor as it is.

    Args:
      tensors: name -> array; emptied as it goes, so each source tensor can be freed
        once its output exists.
      scheme: the lowp scheme.
      rule: `rule(x, scheme)` quantizes in place of `lowp.quantize` (a producer's scale
        rule, `lowp convert --to DIALECT --quantize`).

    Returns:
      (name -> QTensor or array, the number quantized).

    Raises:
      ValueError: naming the linear weight the scheme (or rule) cannot take.
    """
    written: dict = {}
    quantized = 0
    for name in list(tensors):
        array = tensors.pop(name)
        if linear_weights.is_float(array) and not linear_weights.not_a_linear_weight(name, array):
            try:
                if rule is None:
                    written[name] = lowp.quantize(array, scheme, name=name)
                else:
                    written[name] = rule(array, scheme)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from e
            quantized += 1
        else:
            written[name] = array
    return written, quantized


def quantize_shard(path, out_path, scheme) -> dict:
    """Quantize one shard into the lowp file `out_path`; returns what was done."""
    try:
        written, quantized = quantize_linear_weights(lowp.read_arrays(path), scheme)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
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
