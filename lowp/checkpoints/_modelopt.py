"""NVIDIA ModelOpt's Hugging Face export: `quant_method: "modelopt"` in config.json, or
`hf_quant_config.json` with `quantization.quant_algo`.

FP8 (`quant_algo` "FP8"): `X.weight` float8_e4m3fn and `X.weight_scale` float32, one
value amax / 448. "FP8_PER_CHANNEL_PER_TOKEN": the same with one scale per output
channel, stored (out,) (an (out, 1) scale reads too). NVFP4: `X.weight` uint8 (two e2m1 codes a byte,
element 2j in the low nibble), `X.weight_scale` float8_e4m3fn (one per 16 along `in`)
and `X.weight_scale_2` float32: the *decode* global scale amax / (6 * 448), the
reciprocal of compressed-tensors' `weight_global_scale`. `X.input_scale` (static
activation scale) stays a plain array.
"""

import numpy as np

from lowp import _schemes
from lowp.checkpoints import _common, _origin

FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN")
ALGOS = (*FP8_ALGOS, "NVFP4")


def quant_algo(config: dict) -> str:
    quant = config.get("quantization_config", {})
    algo = quant.get("quant_algo")
    if algo is None:
        algo = config.get("hf_quant_config", {}).get("quantization", {}).get("quant_algo")
    if algo not in ALGOS:
        raise ValueError(f"ModelOpt quant_algo {algo!r}: lowp reads {ALGOS}")
    return algo


class Reader:
    dialect = _origin.MODELOPT

    def __init__(self, config: dict):
        self.algo = quant_algo(config)
        self.hp_dtype = _common.hp_dtype_of(config)

    def primary(self, name: str, array: np.ndarray) -> str | None:
        if not name.endswith(".weight"):
            return None
        wanted = np.dtype("float8_e4m3fn") if self.algo in FP8_ALGOS else np.dtype(np.uint8)
        return name if array.dtype == wanted else None

    def companions(self, logical: str, primary: str) -> tuple[str, ...]:
        if self.algo in FP8_ALGOS:
            return (logical + "_scale",)
        return (logical + "_scale", logical + "_scale_2")

    def build(self, logical, primary, arrays):
        weight, scale_name = arrays[primary], logical + "_scale"
        if self.algo in FP8_ALGOS:
            stored, scale_dtype = _common.float_scale(scale_name, arrays[scale_name])
            scheme: _schemes.Scheme
            if stored.size == 1 and stored.ndim <= 1:
                scheme, scale = _schemes.TensorScaling(), _common.scalar(scale_name, stored)
            elif stored.shape in ((weight.shape[0],), (weight.shape[0], 1)):
                scheme, scale = _schemes.AxisScaling(axis=-1), stored.reshape(-1, 1)
            else:
                raise ValueError(
                    f"tensor {scale_name!r}: ModelOpt fp8 scales of shape {stored.shape} for a "
                    f"weight of shape {weight.shape}; expected one, ({weight.shape[0]},) or "
                    f"({weight.shape[0]}, 1)"
                )
            origin = _origin.Origin(self.dialect, (primary, scale_name), scale_dtype, self.hp_dtype)
            return _common.make(
                logical,
                codes=_common.as_bytes(weight),
                scale=scale,
                global_scale=None,
                scheme=scheme,
                shape=weight.shape,
                hp_dtype=self.hp_dtype,
                origin=origin,
            )
        second = logical + "_scale_2"
        block = _common.expect_dtype(
            scale_name, arrays[scale_name], "float8_e4m3fn", "an nvfp4 block scale"
        )
        decode = _common.expect_dtype(second, arrays.pop(second), np.float32, "a global scale")
        origin = _origin.Origin(
            self.dialect, (primary, scale_name, second), "float8_e4m3fn", self.hp_dtype
        )
        return _common.make(
            logical,
            codes=weight,
            scale=_common.as_bytes(block),
            global_scale=_common.scalar(second, decode),
            scheme=_schemes.NVFP4Scaling(),
            shape=weight.shape[:-1] + (weight.shape[-1] * 2,),
            hp_dtype=self.hp_dtype,
            origin=origin,
        )
