"""Writing QTensors as a checkpoint of another tool's dialect, with the config its
loader reads (`config.json`'s `quantization_config`; ModelOpt also `hf_quant_config.json`).

A QTensor read from the same dialect is written back byte for byte (its `origin` keeps
the stored scale dtype and compressed-tensors' encode global scale). A lowp-quantized
tensor is written with float32 scales where the dialect takes float scales (lowp's are
float32), so the producer's loader multiplies by exactly lowp's scale.
"""

import json
import os

import ml_dtypes
import numpy as np

from lowp import _qtensor, _safetensors, _schemes
from lowp.checkpoints import _files, _origin, _torchao

_E4M3 = ml_dtypes.float8_e4m3fn
_FLOAT_DTYPES = {
    "float32": np.float32,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,  # transformers' ue8m0 weight_scale_inv
}


def save_checkpoint(
    directory: str | os.PathLike,
    tensors: "dict[str, _qtensor.QTensor | np.ndarray]",
    dialect: str,
    config: dict | None = None,
) -> None:
    """Write `tensors` to `directory` (created) as `model.safetensors` + `config.json`.

    Args:
      directory: the checkpoint directory.
      tensors: logical name ("layer.weight"; gpt-oss: the name before `_blocks`) ->
        QTensor, or numpy array (written as is).
      dialect: one of DIALECTS.
      config: the rest of config.json (model architecture); its quantization_config is
        replaced by the dialect's.

    Raises:
      ValueError: naming the tensor, for a scheme the dialect cannot store.
    """
    if dialect not in _origin.DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; expected one of {_origin.DIALECTS}")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    groups: list[dict] = []
    for name, value in sorted(tensors.items()):
        if not isinstance(value, _qtensor.QTensor):
            arrays[name] = value
            continue
        q = value.with_scale_layout("plain")
        try:
            stored, args = _STORERS[dialect](name, q)
        except ValueError as e:
            raise ValueError(f"tensor {name!r} ({q.scheme}) in {dialect}: {e}") from e
        clashes = sorted(set(stored) & set(arrays))
        if clashes:
            raise ValueError(f"tensor {clashes[0]!r} would be written twice")
        arrays.update(stored)
        groups.append({"module": name.removesuffix(".weight"), "weights": args})
    full_config = dict(config or {})
    full_config["quantization_config"] = _quantization_config(dialect, groups)
    metadata = {"format": "pt"}
    if dialect == _origin.TORCHAO:
        metadata.update(_torchao_metadata(tensors))
    _safetensors.write(os.path.join(directory, _files.SINGLE), arrays, metadata)
    _write_json(os.path.join(directory, _files.CONFIG), full_config)
    if dialect == _origin.MODELOPT:
        quant = {"quant_algo": full_config["quantization_config"]["quant_algo"]}
        if quant["quant_algo"] == "NVFP4":
            quant["group_size"] = 16
        _write_json(
            os.path.join(directory, _files.HF_QUANT_CONFIG),
            {"producer": {"name": "modelopt"}, "quantization": quant},
        )


def _write_json(path: str, doc: dict) -> None:
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    _safetensors.atomic_write(path, [text.encode("utf-8")])


def _float_scale(q: _qtensor.QTensor) -> np.ndarray:
    """The scales in the dtype the file had (a loaded tensor) or float32 (lowp's)."""
    dtype = q.origin.scale_dtype if q.origin is not None else "float32"
    return q.scale.astype(_FLOAT_DTYPES.get(dtype, np.float32))


def _e4m3(codes: np.ndarray) -> np.ndarray:
    return codes.view(_E4M3)


def _store_hf_fp8(name, q):
    scheme = q.scheme
    if not (isinstance(scheme, _schemes.BlockScaling) and scheme.fmt == "float8_e4m3fn"):
        raise ValueError("hf-fp8 stores float8_e4m3fn BlockScaling")
    return {name: _e4m3(q.codes), name + "_scale_inv": _float_scale(q)}, {
        "block": list(scheme.block),
        "pow2": scheme.pow2,
    }


def _store_compressed_tensors(name, q):
    scheme = q.scheme
    if isinstance(scheme, _schemes.NVFP4Scaling):
        if scheme != _schemes.NVFP4Scaling() or q.global_scale is None:
            raise ValueError("compressed-tensors stores NVFP4Scaling() (block 16, a global scale)")
        if q.origin is not None and q.origin.stored_global_scale is not None:
            encode = q.origin.stored_global_scale.astype(np.float32).reshape(1)
        else:  # lowp's decode scale: its reciprocal, rounded once
            encode = np.divide(np.float32(1), q.global_scale, dtype=np.float32).reshape(1)
        base = name.removesuffix(".weight") + ".weight"
        stored = {
            base + "_packed": q.codes,
            base + "_scale": _e4m3(q.scale),
            base + "_global_scale": encode,
        }
        args = {
            "num_bits": 4,
            "type": "float",
            "symmetric": True,
            "strategy": "tensor_group",
            "group_size": 16,
            "dynamic": False,
            "scale_dtype": "torch.float8_e4m3fn",
        }
        return stored, args
    if getattr(scheme, "fmt", None) != "float8_e4m3fn" or getattr(scheme, "pow2", False):
        raise ValueError("compressed-tensors stores float8_e4m3fn scales without pow2, or NVFP4")
    args = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
    scale = _float_scale(q)
    if isinstance(scheme, _schemes.TensorScaling):
        args["strategy"], scale = "tensor", scale.reshape(1)
    elif (
        isinstance(scheme, _schemes.AxisScaling) and scheme.axis % len(q.shape) == len(q.shape) - 1
    ):
        args["strategy"] = "channel"
    elif (
        isinstance(scheme, _schemes.GroupScaling) and scheme.axis % len(q.shape) == len(q.shape) - 1
    ):
        args["strategy"], args["group_size"] = "group", scheme.block
    elif isinstance(scheme, _schemes.BlockScaling):
        args["strategy"], args["block_structure"] = "block", list(scheme.block)
    else:
        raise ValueError("compressed-tensors groups along the last axis (in)")
    return {name: _e4m3(q.codes), name + "_scale": scale}, args


def _store_modelopt(name, q):
    scheme = q.scheme
    if isinstance(scheme, _schemes.NVFP4Scaling):
        if scheme != _schemes.NVFP4Scaling() or q.global_scale is None:
            raise ValueError("ModelOpt stores NVFP4Scaling() (block 16, a global scale)")
        stored = {
            name: q.codes,
            name + "_scale": _e4m3(q.scale),
            name + "_scale_2": q.global_scale.astype(np.float32),
        }
        return stored, {"algo": "NVFP4"}
    fp8 = getattr(scheme, "fmt", None) == "float8_e4m3fn"
    if fp8 and isinstance(scheme, _schemes.TensorScaling):
        return {name: _e4m3(q.codes), name + "_scale": q.scale.astype(np.float32)}, {"algo": "FP8"}
    if (
        fp8
        and isinstance(scheme, _schemes.AxisScaling)
        and len(q.shape) == 2
        and scheme.axis % 2 == 1
    ):  # ModelOpt's exporter stores a per-channel scale as (out,)
        scale = q.scale.astype(np.float32).reshape(-1)
        return {name: _e4m3(q.codes), name + "_scale": scale}, {"algo": "FP8_PER_CHANNEL_PER_TOKEN"}
    raise ValueError(
        "ModelOpt stores float8_e4m3fn TensorScaling, AxisScaling(axis=-1) of a 2-D weight, "
        "or NVFP4"
    )


def _store_gpt_oss(name, q):
    scheme = q.scheme
    mxfp4 = isinstance(scheme, _schemes.MXScaling) and (scheme.fmt, scheme.block) == (
        "float4_e2m1fn",
        32,
    )
    if not mxfp4:
        raise ValueError(
            "gpt-oss stores MXScaling(fmt='float4_e2m1fn', block=32) along the last axis"
        )
    groups = q.shape[-1] // 32
    blocks = q.codes.reshape(*q.shape[:-1], groups, 16)
    return {name + "_blocks": blocks, name + "_scales": q.scale}, {"algo": "MXFP4"}


def _store_torchao(name, q):
    scheme, shape = q.scheme, q.shape
    if getattr(scheme, "fmt", None) != "float8_e4m3fn" or getattr(scheme, "pow2", False):
        raise ValueError("torchao's Float8Tensor holds float8_e4m3fn codes with float32 scales")
    last = len(shape) - 1
    if isinstance(scheme, _schemes.TensorScaling):
        block, scale = list(shape), q.scale.reshape((1,) * len(shape))
    elif isinstance(scheme, _schemes.AxisScaling) and scheme.axis % len(shape) == last:
        block, scale = [1] * last + [shape[-1]], q.scale
    elif isinstance(scheme, _schemes.GroupScaling) and scheme.axis % len(shape) == last:
        block, scale = [1] * last + [scheme.block], q.scale
    elif (
        isinstance(scheme, _schemes.BlockScaling)
        and len(shape) == 2
        and all(n % b == 0 for n, b in zip(shape, scheme.block, strict=True))
    ):
        block, scale = list(scheme.block), q.scale
    else:
        raise ValueError("torchao stores per tensor, per row, groups or whole 2-D blocks")
    qdata, scale_name = _torchao.parts(name)
    return {qdata: _e4m3(q.codes), scale_name: scale.astype(np.float32)}, {"block_size": block}


def _torchao_metadata(tensors: dict) -> dict[str, str]:
    """torchao's per-tensor metadata: what `unflatten_tensor_state_dict` rebuilds from."""
    metadata = {"tensor_names": json.dumps(sorted(tensors))}
    for name, value in sorted(tensors.items()):
        if not isinstance(value, _qtensor.QTensor):
            metadata[name] = json.dumps({"_type": "Tensor"})
            continue
        _, args = _store_torchao(name, value.with_scale_layout("plain"))
        data = {
            "block_size": args["block_size"],
            "mm_config": None,
            "act_quant_kwargs": None,
            "kernel_preference": {"_type": "KernelPreference", "_data": "AUTO"},
            "dtype": {"_type": "torch.dtype", "_data": value.hp_dtype},
        }
        entry = {"_type": "Float8Tensor", "_data": data, "_tensor_data_names": ["qdata", "scale"]}
        metadata[name] = json.dumps(entry)
    return metadata


_STORERS = {
    _origin.HF_FP8: _store_hf_fp8,
    _origin.COMPRESSED_TENSORS: _store_compressed_tensors,
    _origin.MODELOPT: _store_modelopt,
    _origin.GPT_OSS: _store_gpt_oss,
    _origin.TORCHAO: _store_torchao,
}


def _quantization_config(dialect: str, groups: list[dict]) -> dict:
    """The quantization_config each producer's loader reads; one kind per file."""
    if dialect == _origin.COMPRESSED_TENSORS:
        kinds: dict[str, dict] = {}
        for group in groups:
            key = json.dumps(group["weights"], sort_keys=True)
            kinds.setdefault(key, {"targets": [], "weights": group["weights"]})["targets"].append(
                group["module"]
            )
        nvfp4 = {g["weights"]["num_bits"] == 4 for g in groups}
        fmt = (
            "mixed-precision"
            if len(nvfp4) > 1
            else ("nvfp4-pack-quantized" if nvfp4 == {True} else "float-quantized")
        )
        config_groups = {f"group_{i}": kind for i, kind in enumerate(kinds.values())}
        for kind in config_groups.values():
            kind["format"] = (
                "nvfp4-pack-quantized" if kind["weights"]["num_bits"] == 4 else "float-quantized"
            )
        return {
            "quant_method": "compressed-tensors",
            "format": fmt,
            "quantization_status": "compressed",
            "config_groups": config_groups,
            "ignore": [],
        }
    kinds_seen = {json.dumps(g["weights"], sort_keys=True) for g in groups}
    if len(kinds_seen) > 1 and dialect != _origin.TORCHAO:
        raise ValueError(
            f"a {dialect} checkpoint holds one kind of quantized tensor; got {sorted(kinds_seen)}"
        )
    only = groups[0]["weights"] if groups else {}
    if dialect == _origin.HF_FP8:
        config = {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": only.get("block", [128, 128]),
        }
        if only.get("pow2"):
            config["scale_fmt"] = "ue8m0"
        return config
    if dialect == _origin.MODELOPT:
        return {"quant_method": "modelopt", "quant_algo": only.get("algo", "FP8")}
    if dialect == _origin.TORCHAO:  # the tensors' metadata says the rest
        return {"quant_method": "torchao"}
    return {"quant_method": "mxfp4"}
