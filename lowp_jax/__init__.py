"""lowp_jax: lowp's quantization on JAX arrays, bit-identical to the NumPy reference.

`quantize(x, scheme)` returns a `QArray` whose bytes equal `lowp.quantize`'s on CPU and
GPU, under `jit`, with float32 arithmetic only; `dequantize` inverts it to the same bits
as `lowp.dequantize`. Schemes and formats are lowp's own (`lowp.MXScaling(...)`, ...).

`dot_general` multiplies quantized operands (fp8 GEMM, cuDNN block-scaled GEMM, or
emulation).
"""

from lowp_jax._dot import dot_general, dot_general_impl, scaled_matmul_problem
from lowp_jax._fake_quant import fake_quantize
from lowp_jax._qarray import QArray, from_lowp, to_lowp
from lowp_jax._quantize import dequantize, quantize
from lowp_jax._rounding import random_bits

__all__ = [
    "QArray",
    "dequantize",
    "dot_general",
    "dot_general_impl",
    "fake_quantize",
    "from_lowp",
    "quantize",
    "random_bits",
    "scaled_matmul_problem",
    "to_lowp",
]
