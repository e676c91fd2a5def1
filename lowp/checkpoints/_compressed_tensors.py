"""compressed-tensors (llm-compressor, vLLM): `quant_method: "compressed-tensors"`.

`float-quantized` (also `naive-quantized` with float weights): `X.weight` float8_e4m3fn
and `X.weight_scale` in the model's dtype (often bfloat16), per the config group's
weight `strategy`: "tensor" (shape (1,)), "channel" ((out, 1)), "group" ((out, in /
group_size)), "block" ((ceil(out / b0), ceil(in / b1)), edge tiles partial).
`nvfp4-pack-quantized`: `X.weight_packed` (uint8, two e2m1 codes a byte, element 2j in
the low nibble), `X.weight_scale` (float8_e4m3fn, one per 16 along `in`) and
`X.weight_global_scale` (float32 (1,)): the *encode* scale 448 * 6 / amax, which the
producer divides by (lowp's `global_scale` is a decode scale: the reader stores 1 / g
there and keeps g in `Origin.stored_global_scale`).
"""

import numpy as np

from lowp import _schemes
from lowp.checkpoints import _common, _origin

FLOAT_FORMATS = ("float-quantized", "naive-quantized")
NVFP4_FORMAT = "nvfp4-pack-quantized"
FORMATS = (*FLOAT_FORMATS, NVFP4_FORMAT, "mixed-precision")


def _weight_args(config: dict) -> list[dict]:
    quant = config.get("quantization_config", {})
    fmt = quant.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"compressed-tensors format {fmt!r}: lowp reads {FORMATS}")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError("compressed-tensors quantization_config needs 'config_groups'")
    args = []
    for group_name, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        weights = weights if isinstance(weights, dict) else {}
        if not weights:
            raise ValueError(f"compressed-tensors config group {group_name!r} has no 'weights'")
        if weights.get("type") != "float" or not weights.get("symmetric", True):
            raise ValueError(
                f"compressed-tensors config group {group_name!r}: weights of type "
                f"{weights.get('type')!r}, symmetric={weights.get('symmetric')!r}; lowp reads "
                "symmetric float weights"
            )
        args.append(weights)
    return args


def scheme_of(weights: dict, shape: tuple[int, ...]) -> _schemes.Scheme:
    """The lowp scheme of one config group's weight args."""
    num_bits, strategy = weights.get("num_bits"), weights.get("strategy")
    if num_bits == 4 and strategy == "tensor_group" and weights.get("group_size") == 16:
        return _schemes.NVFP4Scaling()
    if num_bits != 8:
        raise ValueError(
            f"compressed-tensors weights num_bits={num_bits!r}, strategy={strategy!r}: lowp reads fp8 and nvfp4"
        )
    if strategy == "tensor":
        return _schemes.TensorScaling()
    if strategy == "channel":
        return _schemes.AxisScaling(axis=-1)
    if strategy == "group":
        return _schemes.GroupScaling(block=weights["group_size"], axis=-1)
    if strategy == "block":
        return _schemes.BlockScaling(block=tuple(weights["block_structure"]))
    raise ValueError(
        f"compressed-tensors weight strategy {strategy!r}: lowp reads tensor, channel, group, block"
    )


class Reader:
    dialect = _origin.COMPRESSED_TENSORS

    def __init__(self, config: dict):
        self.weights = _weight_args(config)

    def primary(self, name: str, array: np.ndarray) -> str | None:
        if name.endswith(".weight_packed"):
            return name.removesuffix("_packed")
        if name.endswith(".weight") and array.dtype == np.dtype("float8_e4m3fn"):
            return name
        return None

    def companions(self, logical: str, primary: str) -> tuple[str, ...]:
        if primary.endswith("_packed"):  # nvfp4: block scales and the global scale
            return (logical + "_scale", logical + "_global_scale")
        return (logical + "_scale",)

    def build(self, logical, primary, arrays):
        if primary.endswith("_packed"):
            return self._nvfp4(logical, primary, arrays)
        weight, scale_name = arrays[primary], logical + "_scale"
        scale, scale_dtype = _common.float_scale(scale_name, arrays[scale_name])
        scheme = self._scheme(logical, weight.shape, scale.shape, fp4=False)
        if isinstance(scheme, _schemes.TensorScaling):
            scale = _common.scalar(scale_name, scale)
        origin = _origin.Origin(
            self.dialect, (primary, scale_name), scale_dtype, out_dtype=scale_dtype
        )
        return _common.make(
            logical,
            codes=_common.as_bytes(weight),
            scale=scale,
            global_scale=None,
            scheme=scheme,
            shape=weight.shape,
            hp_dtype=scale_dtype,
            origin=origin,
        )

    def _nvfp4(self, logical, primary, arrays):
        scale_name, global_name = logical + "_scale", logical + "_global_scale"
        packed = _common.expect_dtype(primary, arrays[primary], np.uint8, "packed fp4 codes")
        block = _common.expect_dtype(
            scale_name, arrays[scale_name], "float8_e4m3fn", "an nvfp4 block scale"
        )
        stored = _common.expect_dtype(
            global_name, arrays.pop(global_name), np.float32, "a global scale"
        )
        encode = _common.scalar(global_name, stored)
        shape = packed.shape[:-1] + (packed.shape[-1] * 2,)
        self._scheme(logical, shape, block.shape, fp4=True)
        with np.errstate(divide="ignore"):
            decode = np.asarray(np.divide(np.float32(1), encode, dtype=np.float32)).reshape(())
        origin = _origin.Origin(
            self.dialect,
            (primary, scale_name, global_name),
            "float8_e4m3fn",
            out_dtype="bfloat16",  # the compressor unpacks fp4 to bfloat16
            stored_global_scale=stored.copy(),
        )
        return _common.make(
            logical,
            codes=packed,
            scale=_common.as_bytes(block),
            global_scale=decode,
            scheme=_schemes.NVFP4Scaling(),
            shape=shape,
            hp_dtype="bfloat16",
            origin=origin,
        )

    def _scheme(self, logical: str, shape, scale_shape, fp4: bool) -> _schemes.Scheme:
        """The scheme of the config group whose scale shape the stored scale has (the
        file does not say which group a module is in); several that fit must agree."""
        schemes = []
        for weights in self.weights:
            try:
                scheme = scheme_of(weights, tuple(shape))
                expected = scheme.scale_shape(tuple(shape))
            except (KeyError, TypeError, ValueError):
                continue
            fits = tuple(scale_shape) == expected or (expected == () and tuple(scale_shape) == (1,))
            if fits and isinstance(scheme, _schemes.NVFP4Scaling) == fp4 and scheme not in schemes:
                schemes.append(scheme)
        if len(schemes) != 1:
            raise ValueError(
                f"compressed-tensors tensor {logical!r}: {len(schemes)} config groups describe "
                f"{'nvfp4' if fp4 else 'fp8'} weights of shape {tuple(shape)} with scales of "
                f"shape {tuple(scale_shape)} ({schemes}); lowp needs exactly one"
            )
        return schemes[0]
