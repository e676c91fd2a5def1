"""lowp_torch: the PyTorch frontend of lowp, byte for byte the NumPy reference.

`quantize` and `dequantize` produce the bytes `lowp.quantize` / `lowp.dequantize` do,
for every scheme and format of the core, on CPU and CUDA, in eager mode and under
torch.compile (spec §0 of docs/numerics.md says how).
"""

from lowp_torch._convert import from_lowp, to_lowp
from lowp_torch._qtensor import QuantizedTensor
from lowp_torch._quantize import dequantize, quantize
from lowp_torch._rounding import random_bits

__all__ = [
    "QuantizedTensor",
    "dequantize",
    "from_lowp",
    "quantize",
    "random_bits",
    "to_lowp",
]
