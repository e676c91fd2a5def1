"""torchao's safetensors format (`torchao.prototype.safetensors`) for its Float8Tensor.

A Float8Tensor `M.W` is stored as `M._W_qdata` (float8_e4m3fn) and `M._W_scale`
(float32), with the header's `__metadata__` holding `tensor_names` (a JSON list) and,
under `M.W`, a JSON object: `{"_type": "Float8Tensor", "_data": {"block_size": [...],
"dtype": {"_type": "torch.dtype", "_data": "bfloat16"}, ...}, "_tensor_data_names":
["qdata", "scale"]}`. `block_size` is the group: the whole shape (per tensor, scale
(1, 1)), [1, K] (per row, (N, 1)), [1, b] (groups) or [b0, b1] (blocks). torchao
dequantizes as `(qdata.to(float32) * scale).to(dtype)`.
"""

import json

import numpy as np

from lowp import _schemes
from lowp.checkpoints import _common, _origin

FLOAT8 = "Float8Tensor"


def entries(metadata: dict) -> dict[str, dict]:
    """name -> parsed entry of a torchao file's metadata (empty if it is not one)."""
    if "tensor_names" not in metadata:
        return {}
    try:
        names = json.loads(metadata["tensor_names"])
        out = {name: json.loads(metadata[name]) for name in names}
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"torchao metadata: 'tensor_names' and an entry for each: {e!r}") from e
    bad = [name for name, doc in out.items() if not isinstance(doc, dict) or "_type" not in doc]
    if bad:
        raise ValueError(f"torchao metadata for {bad[0]!r} is not an object with '_type'")
    return out


def parts(logical: str) -> tuple[str, str]:
    """The stored names of Float8Tensor `logical`'s qdata and scale."""
    module, _, attr = logical.rpartition(".")
    prefix = f"{module}._{attr}_" if module else f"_{attr}_"
    return prefix + "qdata", prefix + "scale"


def scheme_of(block_size, shape: tuple[int, ...]) -> _schemes.Scheme:
    block = tuple(block_size)
    if len(block) != len(shape) or len(shape) < 2 or any(b <= 0 for b in block):
        raise ValueError(f"block_size {list(block)} does not fit shape {shape}")
    if block == shape:
        return _schemes.TensorScaling()
    if all(b == 1 for b in block[:-1]):
        if block[-1] == shape[-1]:
            return _schemes.AxisScaling(axis=-1)
        return _schemes.GroupScaling(block=block[-1], axis=-1)
    if len(shape) == 2:
        return _schemes.BlockScaling(block=(block[0], block[1]))
    raise ValueError(
        f"block_size {list(block)} of shape {shape}: lowp reads per tensor, row, group or 2-D block"
    )


class Reader:
    dialect = _origin.TORCHAO

    def __init__(self, config: dict):
        self.entries = config.get("torchao", {})
        self.by_qdata = {
            parts(name)[0]: name for name, doc in self.entries.items() if doc.get("_type") == FLOAT8
        }
        unknown = sorted(
            {doc.get("_type") for doc in self.entries.values()} - {FLOAT8, "Tensor", "torch.Tensor"}
        )
        if unknown:
            raise ValueError(f"torchao tensor type {unknown[0]!r}: lowp reads {FLOAT8}")

    def primary(self, name: str, array: np.ndarray) -> str | None:
        return self.by_qdata.get(name)

    def companions(self, logical: str, primary: str) -> tuple[str, ...]:
        return (parts(logical)[1],)

    def build(self, logical, primary, arrays):
        scale_name = parts(logical)[1]
        data = self.entries[logical].get("_data", {})
        qdata = _common.expect_dtype(
            primary, arrays[primary], "float8_e4m3fn", "Float8Tensor qdata"
        )
        scale = _common.expect_dtype(
            scale_name, arrays[scale_name], np.float32, "a Float8Tensor scale"
        )
        hp_dtype = data.get("dtype", {}).get("_data", "float32")
        scheme = scheme_of(data.get("block_size", list(qdata.shape)), qdata.shape)
        if isinstance(scheme, _schemes.TensorScaling):
            scale = _common.scalar(scale_name, scale)
        origin = _origin.Origin(self.dialect, (primary, scale_name), "float32", out_dtype=hp_dtype)
        return _common.make(
            logical,
            codes=_common.as_bytes(qdata),
            scale=scale,
            global_scale=None,
            scheme=scheme,
            shape=qdata.shape,
            hp_dtype=hp_dtype,
            origin=origin,
        )
