"""Detecting a checkpoint's dialect and reading it, shard by shard, into QTensors.

The dialect comes from `config.json`'s `quantization_config.quant_method` (or ModelOpt's
`hf_quant_config.json`); a lone file without one is recognised by the tensor names only
one dialect uses. Each dialect's reader says which stored tensor holds a quantized
tensor's codes and which hold its scales; a tensor no reader claims stays a plain array.
"""

import os

import numpy as np

from lowp import _interchange, _qtensor
from lowp.checkpoints import (
    _compressed_tensors,
    _files,
    _gpt_oss,
    _hf_fp8,
    _modelopt,
    _origin,
    _torchao,
)

_QUANT_METHODS = {
    "fp8": _origin.HF_FP8,
    "compressed-tensors": _origin.COMPRESSED_TENSORS,
    "modelopt": _origin.MODELOPT,
    "mxfp4": _origin.GPT_OSS,
    "torchao": _origin.TORCHAO,
}
_READERS = {
    _origin.HF_FP8: _hf_fp8.Reader,
    _origin.COMPRESSED_TENSORS: _compressed_tensors.Reader,
    _origin.MODELOPT: _modelopt.Reader,
    _origin.GPT_OSS: _gpt_oss.Reader,
    _origin.TORCHAO: _torchao.Reader,
}
# What a lone file (no config.json) of each recognisable dialect is read with.
_NVFP4_GROUP = {
    "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
}
_IMPLIED_CONFIGS: dict[str, dict] = {
    _origin.HF_FP8: {"quantization_config": {"quant_method": "fp8"}},
    _origin.COMPRESSED_TENSORS: {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": _NVFP4_GROUP},
        }
    },
    _origin.MODELOPT: {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}},
    _origin.GPT_OSS: {"quantization_config": {"quant_method": "mxfp4"}},
}


def detect(path: str | os.PathLike) -> str | None:
    """The dialect of checkpoint `path` (a directory or a safetensors file), or None
    for a lowp file or one with no quantized tensors lowp recognises."""
    return _dialect_and_config(os.fspath(path))[0]


def is_checkpoint(path: str | os.PathLike) -> bool:
    """True where `lowp.load` should read `path` as another tool's checkpoint: a
    directory, or a file of a recognised dialect without lowp's metadata."""
    path = os.fspath(path)
    return os.path.isdir(path) or detect(path) is not None


def checkpoint_activations(path: str | os.PathLike) -> dict:
    """The activation schemes of checkpoint `path`, as `lowp.load_activations` gives them:
    those lowp's own files in a directory record (merged over its shards), {} for
    another tool's checkpoint, which records none.

    Raises:
      ValueError: for a directory with no safetensors file, as `load_checkpoint` does.
    """
    path = os.fspath(path)
    dialect, _ = _dialect_and_config(path)
    shards = _files.shard_paths(path)
    if dialect is not None:
        return {}
    activations: dict = {}
    for shard in shards:
        activations.update(_interchange.load_activations(shard))
    return activations


def load_checkpoint(
    path: str | os.PathLike, *, verify: bool = True
) -> dict[str, "_qtensor.QTensor | np.ndarray"]:
    """Read checkpoint `path` (a directory, sharded or not, or one safetensors file).

    `verify` is `lowp.load`'s, for shards that are lowp's own files (other tools'
    record no checksums).

    Returns:
      logical name -> QTensor (with `origin` saying the dialect and the stored names)
      for each quantized tensor, numpy array for every other tensor; sorted by name.
      The logical name is the module's weight ("model.layers.0.mlp.down_proj.weight",
      compressed-tensors' `weight_packed` included), gpt-oss's the name before `_blocks`.

    Raises:
      ValueError: naming the file or tensor, for an unknown dialect or configuration, a
        quantized tensor whose scales are missing or do not fit, or a corrupt file.
    """
    path = os.fspath(path)
    dialect, config = _dialect_and_config(path)
    paths = _files.shard_paths(path)
    loaded: dict[str, _qtensor.QTensor | np.ndarray] = {}
    if dialect is None:  # lowp's own files, or plain arrays: each shard as `lowp.load` reads it
        for shard in paths:
            contents = _interchange.load(shard, verify=verify)
            clashes = sorted(set(contents) & set(loaded))
            if clashes:
                raise ValueError(f"{shard}: tensor {clashes[0]!r} is also in another shard")
            loaded.update(contents)
        return dict(sorted(loaded.items()))
    reader = _READERS[dialect](config)
    pending: dict[str, np.ndarray] = {}
    for shard, arrays in _files.read_shards(paths):
        clashes = sorted(set(arrays) & (set(pending) | set(loaded)))
        if clashes:
            raise ValueError(f"{shard}: tensor {clashes[0]!r} is also in another shard")
        pending.update(arrays)
        _claim(reader, pending, loaded, path)
    missing = _unclaimed_primaries(reader, pending)
    if missing:
        name, needed = missing[0]
        raise ValueError(f"{path}: quantized tensor {name!r} has no {needed!r} in any shard")
    loaded.update(pending)  # activation scales and unquantized tensors
    return dict(sorted(loaded.items()))


def _claim(reader, pending: dict, loaded: dict, path) -> None:
    """Move every quantized tensor whose arrays are all in `pending` into `loaded`."""
    for name in list(pending):
        if name not in pending:  # taken as a companion already
            continue
        logical = reader.primary(name, pending[name])
        if logical is None or not all(c in pending for c in reader.companions(logical, name)):
            continue
        if logical in loaded:
            raise ValueError(f"{path}: two stored tensors make {logical!r}")
        try:
            loaded[logical] = reader.build(logical, name, pending)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        for stored in loaded[logical].origin.names:
            pending.pop(stored, None)


def _unclaimed_primaries(reader, pending: dict) -> list[tuple[str, str]]:
    out = []
    for name, array in pending.items():
        logical = reader.primary(name, array)
        if logical is not None:
            out += [(name, c) for c in reader.companions(logical, name) if c not in pending]
    return out


def _dialect_and_config(path: str) -> tuple[str | None, dict]:
    """The dialect and configuration of a directory, or of a file from the config.json
    beside it or else from its tensor names. A lowp file has none; so has a file beside
    a config of a quant_method lowp does not read (it loads as plain arrays, as before)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    is_dir = os.path.isdir(path)
    if not is_dir and _interchange.METADATA_KEY in _files.file_metadata(path):
        return None, {}  # lowp's own file
    config = _files.checkpoint_config(path)
    method = config.get("quantization_config", {}).get("quant_method")
    if (
        method is None
        and config.get("hf_quant_config", {}).get("producer", {}).get("name") == "modelopt"
    ):
        method = "modelopt"
    if method in _QUANT_METHODS and _QUANT_METHODS[method] != _origin.TORCHAO:
        return _QUANT_METHODS[method], config
    torchao = _torchao_entries(path)  # torchao says so in each file's metadata
    if torchao or method == "torchao":
        return _origin.TORCHAO, {**config, "torchao": torchao}
    if is_dir:
        if method is not None:
            raise ValueError(
                f"{path}: quantization_config.quant_method {method!r}; lowp reads {tuple(_QUANT_METHODS)}"
            )
        return None, config
    dialect = _dialect_of_names(_files.tensor_names(path))
    return dialect, _IMPLIED_CONFIGS[dialect] if dialect else config


def _torchao_entries(path: str) -> dict:
    """The torchao metadata entries of every shard of `path` (headers only)."""
    entries: dict = {}
    for shard in _files.shard_paths(path):
        entries.update(_torchao.entries(_files.file_metadata(shard)))
    return entries


def _dialect_of_names(names: dict[str, str]) -> str | None:
    """The one dialect whose tensor names a file without config.json uses, or None.
    (compressed-tensors' and ModelOpt's fp8 both store weight + weight_scale: such a
    file needs its config.json.)"""
    if any(n.endswith(".weight" + _hf_fp8.SCALE_SUFFIX) for n in names):
        return _origin.HF_FP8
    if any(n.endswith(".weight_packed") for n in names) and any(
        n.endswith(".weight_global_scale") for n in names
    ):
        return _origin.COMPRESSED_TENSORS
    if any(n.endswith(".weight_scale_2") for n in names):
        return _origin.MODELOPT
    if any(
        n.endswith(_gpt_oss.BLOCKS) and n.removesuffix(_gpt_oss.BLOCKS) + _gpt_oss.SCALES in names
        for n in names
    ):
        return _origin.GPT_OSS
    return None
