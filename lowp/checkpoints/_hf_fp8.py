"""transformers' fine-grained fp8 (DeepSeek-V3, Qwen3-FP8): `quant_method: "fp8"`.

Each quantized linear stores `X.weight` (float8_e4m3fn, (out, in)) and
`X.weight_scale_inv` (float32, one per `weight_block_size` tile, default 128 x 128;
ceil-divided, edge tiles partial). Despite its name `weight_scale_inv` is the
dequantization *multiplier*: w ~ weight * weight_scale_inv. With `scale_fmt: "ue8m0"`
(DeepSeek-V3.1) every scale is a power of two, stored as float32 or float8_e8m0fnu.
"""

import numpy as np

from lowp import _schemes
from lowp.checkpoints import _common, _origin

SCALE_SUFFIX = "_scale_inv"


class Reader:
    dialect = _origin.HF_FP8

    def __init__(self, config: dict):
        quant = config.get("quantization_config", {})
        block = quant.get("weight_block_size", [128, 128])
        if not (
            isinstance(block, list)
            and len(block) == 2
            and all(isinstance(b, int) and b > 0 for b in block)
        ):
            raise ValueError(
                f"quantization_config.weight_block_size must be two positive ints, got {block!r}"
            )
        scale_fmt = quant.get("scale_fmt")
        if scale_fmt not in (None, "float", "ue8m0"):  # transformers writes "float" by default
            raise ValueError(
                f"quantization_config.scale_fmt {scale_fmt!r}: lowp reads none, 'float' or 'ue8m0'"
            )
        self.block = (block[0], block[1])
        self.ue8m0 = scale_fmt == "ue8m0"
        self.hp_dtype = _common.hp_dtype_of(config)

    def primary(self, name: str, array: np.ndarray) -> str | None:
        if name.endswith(".weight") and array.dtype == np.dtype("float8_e4m3fn"):
            return name
        return None

    def companions(self, logical: str, primary: str) -> tuple[str, ...]:
        return (logical + SCALE_SUFFIX,)

    def build(self, logical, primary, arrays):
        scale_name = logical + SCALE_SUFFIX
        weight = arrays[primary]
        scale, scale_dtype = _common.float_scale(scale_name, arrays[scale_name])
        if self.ue8m0:
            mantissa = scale.view(np.uint32) & np.uint32(0x007FFFFF)
            if mantissa.any():
                value = scale.reshape(-1)[np.argmax(mantissa.reshape(-1) != 0)]
                raise ValueError(
                    f"tensor {scale_name!r} holds {value!r}, not a power of two, under scale_fmt 'ue8m0'"
                )
        origin = _origin.Origin(
            self.dialect, (primary, scale_name), scale_dtype, out_dtype=self.hp_dtype
        )
        return _common.make(
            logical,
            codes=_common.as_bytes(weight),
            scale=scale,
            global_scale=None,
            scheme=_schemes.BlockScaling(block=self.block, pow2=self.ue8m0),
            shape=weight.shape,
            hp_dtype=self.hp_dtype,
            origin=origin,
        )
