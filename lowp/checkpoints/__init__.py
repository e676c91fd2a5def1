"""Checkpoints other tools write: read them into QTensors, dequantize as their producers do.

Dialects (`DIALECTS`; docs/checkpoints.md gives each one's names and arithmetic):
  hf-fp8              transformers' fine-grained fp8, DeepSeek-V3 (`weight_scale_inv`)
  compressed-tensors  llm-compressor's float-quantized and nvfp4-pack-quantized
  modelopt            NVIDIA ModelOpt's FP8 and NVFP4 export
  gpt-oss             gpt-oss's MXFP4 `*_blocks` / `*_scales`
  torchao             torchao's safetensors format for its Float8Tensor

`lowp.load(path)` reads a checkpoint directory, or a file in one of these dialects,
through `load_checkpoint`; each quantized tensor comes back a `lowp.QTensor` whose
`origin` names its dialect, and `lowp.dequantize` of it follows the producer's own
arithmetic (`producer_dequantize`), bit for bit. `quantize_like` goes the other way:
the bytes a producer (`PRODUCERS`) writes from the same high-precision weights.
"""

from lowp.checkpoints._dequantize import ProducerPlan, producer_dequantize, producer_plan
from lowp.checkpoints._origin import DIALECTS, Origin
from lowp.checkpoints._producer_rules import PRODUCERS, quantize_like
from lowp.checkpoints._read import checkpoint_activations, detect, is_checkpoint, load_checkpoint
from lowp.checkpoints._write import save_checkpoint

__all__ = [
    "DIALECTS",
    "PRODUCERS",
    "Origin",
    "ProducerPlan",
    "checkpoint_activations",
    "detect",
    "is_checkpoint",
    "load_checkpoint",
    "producer_dequantize",
    "producer_plan",
    "quantize_like",
    "save_checkpoint",
]
