"""The files of a checkpoint: `config.json`, and its safetensors shards one at a time.

A checkpoint directory holds `config.json` (its `quantization_config` names the dialect)
and either `model.safetensors` or shards listed by `model.safetensors.index.json`
(`weight_map`: tensor name -> shard file). A single `.safetensors` file is read with
the `config.json` beside it, if there is one.
"""

import json
import os
from collections.abc import Iterator

import numpy as np

from lowp import _safetensors

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt writes its quantization config here


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read JSON: {e}") from e
    if isinstance(doc, dict):
        return doc
    raise ValueError(f"{path}: expected a JSON object, got {type(doc).__name__}")


def checkpoint_config(path: str) -> dict:
    """`config.json` of the checkpoint `path` (a directory, or a file in one), with
    ModelOpt's `hf_quant_config.json` under "hf_quant_config"; {} if there is none."""
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    config = {}
    if os.path.isfile(os.path.join(directory, CONFIG)):
        config = read_json(os.path.join(directory, CONFIG))
    if os.path.isfile(os.path.join(directory, HF_QUANT_CONFIG)):
        config = {**config, "hf_quant_config": read_json(os.path.join(directory, HF_QUANT_CONFIG))}
    for key, inner in (("quantization_config", None), ("hf_quant_config", "quantization")):
        value = config.get(key, {})
        if inner is not None and isinstance(value, dict):
            value = value.get(inner, {})
        where = key if inner is None else f"{key}.{inner}"
        _check_object(value, f"{directory}: {where}")
    return config


def shard_paths(path: str) -> list[str]:
    """The safetensors files of checkpoint `path`, in the index's order."""
    if not os.path.isdir(path):
        return [path]
    index = os.path.join(path, INDEX)
    if os.path.isfile(index):
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise ValueError(f"{index}: 'weight_map' must map tensor names to file names")
        shards = list(dict.fromkeys(weight_map.values()))
        for shard in shards:
            if os.path.basename(shard) != shard:  # a shard outside the directory
                raise ValueError(f"{index}: shard {shard!r} is not a file name in {path}")
        return [os.path.join(path, shard) for shard in shards]
    single = os.path.join(path, SINGLE)
    if os.path.isfile(single):
        return [single]
    found = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not found:
        raise ValueError(
            f"{path}: a directory with no {INDEX}, {SINGLE} or other .safetensors file "
            "(lowp.load reads a safetensors file or a checkpoint directory)"
        )
    return [os.path.join(path, f) for f in found]


def read_shards(paths: list[str]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """(path, name -> array) of each shard in turn; one shard in memory at a time."""
    for path in paths:
        arrays, _ = _safetensors.read(path)
        yield path, arrays


def tensor_names(path: str) -> dict[str, str]:
    """name -> safetensors dtype name of a file, from its header alone."""
    with open(path, "rb") as f:
        header, _ = _safetensors.read_header(f, os.fstat(f.fileno()).st_size, path)
    return {
        name: info.get("dtype", "") if isinstance(info, dict) else ""
        for name, info in header.items()
        if name != "__metadata__"
    }


def file_metadata(path: str) -> dict:
    with open(path, "rb") as f:
        header, _ = _safetensors.read_header(f, os.fstat(f.fileno()).st_size, path)
    metadata = header.get("__metadata__", {})
    return metadata if isinstance(metadata, dict) else {}


def _check_object(value, where: str) -> None:
    """Every reader looks fields up in the quantization configs: they must be objects."""
    if isinstance(value, dict):
        return
    raise ValueError(f"{where} must be a JSON object, got {value!r:.80}")
