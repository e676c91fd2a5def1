"""gpt-oss's MXFP4 experts: `quant_method: "mxfp4"`.

`X_blocks` (uint8, (..., G, 16): 32 e2m1 codes in 16 bytes, element 2j in the low
nibble) and `X_scales` (uint8, (..., G): biased exponents, scale 2**(byte - 127), the
bytes of float8_e8m0fnu). The logical tensor is (..., G * 32), blocked along its last
axis in groups of 32: MX's layout. transformers dequantizes with `ldexp` in bfloat16,
where byte 255 gives Inf (OCP's e8m0 reads it as NaN).
"""

import numpy as np

from lowp import _schemes
from lowp.checkpoints import _common, _origin

BLOCKS, SCALES = "_blocks", "_scales"


class Reader:
    dialect = _origin.GPT_OSS

    def __init__(self, config: dict):
        self.hp_dtype = "bfloat16"

    def primary(self, name: str, array: np.ndarray) -> str | None:
        return name.removesuffix(BLOCKS) if name.endswith(BLOCKS) else None

    def companions(self, logical: str, primary: str) -> tuple[str, ...]:
        return (logical + SCALES,)

    def build(self, logical, primary, arrays):
        scales_name = logical + SCALES
        blocks = _common.expect_dtype(primary, arrays[primary], np.uint8, "packed fp4 blocks")
        scales = _common.expect_dtype(
            scales_name, arrays[scales_name], np.uint8, "e8m0 scale bytes"
        )
        if blocks.ndim < 2 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
            raise ValueError(
                f"gpt-oss tensor {logical!r}: blocks {blocks.shape} and scales {scales.shape} "
                "must be (..., G, 16) and (..., G)"
            )
        prefix, groups = blocks.shape[:-2], blocks.shape[-2]
        origin = _origin.Origin(self.dialect, (primary, scales_name), "uint8", self.hp_dtype)
        return _common.make(
            logical,
            codes=blocks.reshape(*prefix, groups * 16),
            scale=scales,
            global_scale=None,
            scheme=_schemes.MXScaling(fmt="float4_e2m1fn", block=32),
            shape=(*prefix, groups * 32),
            hp_dtype=self.hp_dtype,
            origin=origin,
        )
