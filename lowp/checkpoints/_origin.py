"""Origin: which checkpoint dialect a loaded QTensor came from, and what that means.

Tools store the same kinds of bytes (float8 codes, e4m3 or e8m0 block scales, packed
float4) under different names and conventions. A QTensor read from such a file keeps
its codes and scales in lowp's form (`QTensor.codes`, `.scale`, `.global_scale`) and an
`Origin` saying what the file held, so that `lowp.dequantize` can follow the producer's
own arithmetic and a writer can give the file's bytes back.
"""

import dataclasses

import numpy as np

# The dialects lowp reads, by the name `Origin.dialect` and `lowp convert --to` use.
HF_FP8 = "hf-fp8"  # transformers' fine-grained fp8, DeepSeek-V3's weight_scale_inv
COMPRESSED_TENSORS = "compressed-tensors"  # llm-compressor's float-quantized, nvfp4-pack
MODELOPT = "modelopt"  # NVIDIA ModelOpt's FP8 and NVFP4 export
GPT_OSS = "gpt-oss"  # gpt-oss's MXFP4 *_blocks / *_scales
TORCHAO = "torchao"  # torchao's safetensors format for its Float8Tensor
DIALECTS = (HF_FP8, COMPRESSED_TENSORS, MODELOPT, GPT_OSS, TORCHAO)


@dataclasses.dataclass(frozen=True, eq=False)
class Origin:
    """Where a loaded QTensor came from.

    Attributes:
      dialect: one of DIALECTS.
      names: the tensors the file stores it as, codes first ("x.weight",
        "x.weight_scale_inv").
      scale_dtype: the dtype the file stores its (block) scales in: "float32",
        "bfloat16", "float16", "float8_e4m3fn", "float8_e8m0fnu" or "uint8".
      out_dtype: the dtype the producer's own dequantization returns.
      stored_global_scale: the per-tensor scale exactly as the file holds it (float32),
        where the file's convention differs from lowp's decode scale (compressed-tensors
        stores the encode scale 448*6/amax; lowp's `global_scale` is its reciprocal).
    """

    dialect: str
    names: tuple[str, ...]
    scale_dtype: str
    out_dtype: str
    stored_global_scale: np.ndarray | None = None

    def __post_init__(self):
        if self.dialect not in DIALECTS:
            raise ValueError(f"Origin.dialect must be one of {DIALECTS}, got {self.dialect!r}")

    def __repr__(self):
        return (
            f"Origin({self.dialect!r}, names={list(self.names)}, scale_dtype={self.scale_dtype!r})"
        )
