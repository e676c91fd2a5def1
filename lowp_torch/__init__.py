"""lowp_torch: the PyTorch frontend of lowp, byte for byte the NumPy reference.

`quantize` and `dequantize` produce the bytes `lowp.quantize` / `lowp.dequantize` do,
for every scheme and format of the core, on CPU and CUDA, in eager mode and under
torch.compile (spec §0 of docs/numerics.md says how). `QuantizedTensor` is a
torch.Tensor subclass a model can hold as a weight; `scaled_matmul` lowers a quantized
GEMM to torch._scaled_mm, fbgemm or emulation; `quantize_` converts a model's linears
for inference.

Training (spec §8): `convert_to_training(model, recipe)` swaps each nn.Linear for a
`Linear` whose forward, dgrad and wgrad GEMMs are quantized as the recipe says, in
eager mode and under torch.compile; `training_operands` shows the bytes each GEMM gets;
`to_inference` turns the trained model into `quantize_`'s inference form;
`fsdp_quantized_all_gather` has FSDP2 gather its weights as codes and scales;
`parallelize_quantized` shards `quantize_`'d layers under DTensor tensor parallelism.
Mixture of experts (spec §10): `grouped_mm(x, w, offs, recipe)` runs the three grouped
GEMMs of stacked experts quantized, and `GroupedExperts` /
`convert_experts_to_training` put it into a model.

Speed without torch.compile: on CUDA, eager `quantize` runs fp8 tensorwise, rowwise
and MX casts as fused Triton kernels (same bytes); `cast_kernels` picks the path.
"""

import torch

from lowp import extend
from lowp_torch import (
    _cast_ops,  # noqa: F401 - registers the lowp:: custom ops
    _decode_op,  # noqa: F401 - registers lowp::decode_linear
)
from lowp_torch._cast_kernels import cast_kernels
from lowp_torch._checkpoints import dequantize_checkpoint
from lowp_torch._config import LinearConfig
from lowp_torch._convert import from_lowp, to_lowp
from lowp_torch._fsdp import fsdp_quantized_all_gather
from lowp_torch._gemm import scaled_matmul
from lowp_torch._grouped_experts import (
    GroupedExperts,
    convert_experts_to_training,
    quantize_experts_,
)
from lowp_torch._grouped_mm import grouped_mm, grouped_operands
from lowp_torch._model import (
    load_quantized,
    memory_footprint,
    quantize_,
    save_quantized,
    to_inference,
)
from lowp_torch._pretrained import from_pretrained, save_pretrained
from lowp_torch._qtensor import QuantizedTensor
from lowp_torch._quantize import dequantize, quantize
from lowp_torch._rounding import random_bits
from lowp_torch._tensor_parallel import parallelize_quantized
from lowp_torch._training import training_operands
from lowp_torch._training_linear import Linear, convert_to_training, small_shapes_report
from lowp_torch._weight_cache import weight_cache

# torch.load(weights_only=True), the default since torch 2.6, unpickles only allowlisted
# globals. A state_dict of a quantize_'d model pickles QuantizedTensors, which carry
# lowp schemes and a LinearConfig: plain frozen dataclasses that check their fields on
# construction, holding no code to run. Registering them here, once, lets such a
# checkpoint load with the safe loader without every user learning these class names.
torch.serialization.add_safe_globals([QuantizedTensor, LinearConfig, *extend.SCHEME_TYPES])

__all__ = [
    "GroupedExperts",
    "Linear",
    "LinearConfig",
    "QuantizedTensor",
    "cast_kernels",
    "convert_experts_to_training",
    "convert_to_training",
    "dequantize",
    "dequantize_checkpoint",
    "from_lowp",
    "from_pretrained",
    "fsdp_quantized_all_gather",
    "grouped_mm",
    "grouped_operands",
    "load_quantized",
    "memory_footprint",
    "parallelize_quantized",
    "quantize",
    "quantize_",
    "quantize_experts_",
    "random_bits",
    "save_pretrained",
    "save_quantized",
    "scaled_matmul",
    "small_shapes_report",
    "to_inference",
    "to_lowp",
    "training_operands",
    "weight_cache",
]
