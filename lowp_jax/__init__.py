"""lowp_jax: lowp's quantization on JAX arrays, bit-identical to the NumPy reference.

`quantize(x, scheme)` returns a `QArray` whose bytes equal `lowp.quantize`'s on CPU and
GPU, under `jit`, with float32 arithmetic only; `dequantize` inverts it to the same bits
as `lowp.dequantize`. Schemes and formats are lowp's own (`lowp.MXScaling(...)`, ...).

`dot_general` multiplies quantized operands (fp8 GEMM, cuDNN block-scaled GEMM, or
emulation); `QuantizedDotGeneral` / `dot_general_cls` put it into flax layers, and
`quantize_params`, `save_quantized`, `load_quantized` convert and store trained
parameters. The flax layers themselves are in `lowp_jax.nnx` and `lowp_jax.linen`
(imported on first use: they need flax).

Training (spec §8): `training_dot_general` runs a `lowp.Recipe`'s forward, dgrad and
wgrad GEMMs on operands quantized at each call (a `jax.custom_vjp`, stateless);
`TrainingDotGeneral` / `training_dot_general_cls` put it into flax layers,
`training_operands` returns the quantized operands of every GEMM, and `to_inference`
turns the trained parameters or nnx model into the `quantize_params` form.

Sharding: `all_gather_quantized` (and, inside `shard_map`, `quantize_gathered`,
`quantize_shard`) quantizes a weight sharded along its first axis shard by shard and
gathers codes and scales, the bytes of quantizing it whole; `shard_quantized` places a
whole QArray (loaded from an interchange file) sharded on a mesh.

Switches, each a scoped context manager read when a computation is traced:
`cast_kernels("xla")` keeps the float8 casts off the Pallas kernel, and
`gemm_output("float32")` has every fp8 GEMM write float32.

Mixture of experts (spec §10): `ragged_dot(lhs, rhs, group_sizes, recipe=...)` is
`jax.lax.ragged_dot` with a recipe's quantized grouped GEMMs and a custom VJP.
"""

import importlib

from lowp_jax._checkpoints import dequantize_checkpoint
from lowp_jax._dot import dot_general, dot_general_impl, gemm_output, scaled_matmul_problem
from lowp_jax._fake_quant import fake_quantize
from lowp_jax._pallas_cast import cast_kernels
from lowp_jax._params import load_quantized, quantize_params, save_quantized, to_inference
from lowp_jax._qarray import QArray, from_lowp, to_lowp
from lowp_jax._quantize import dequantize, quantize
from lowp_jax._quantized_dot import QuantizedDotGeneral, dot_general_cls
from lowp_jax._ragged_dot import grouped_operands, ragged_dot
from lowp_jax._rounding import random_bits
from lowp_jax._sharding import (
    all_gather_quantized,
    quantize_gathered,
    quantize_shard,
    shard_quantized,
)
from lowp_jax._training import (
    TrainingDotGeneral,
    training_dot_general,
    training_dot_general_cls,
    training_operands,
)

__all__ = [
    "QArray",
    "QuantizedDotGeneral",
    "TrainingDotGeneral",
    "all_gather_quantized",
    "cast_kernels",
    "dequantize",
    "dequantize_checkpoint",
    "dot_general",
    "dot_general_cls",
    "dot_general_impl",
    "fake_quantize",
    "from_lowp",
    "gemm_output",
    "grouped_operands",
    "load_quantized",
    "quantize",
    "quantize_gathered",
    "quantize_params",
    "quantize_shard",
    "ragged_dot",
    "random_bits",
    "save_quantized",
    "scaled_matmul_problem",
    "shard_quantized",
    "to_inference",
    "to_lowp",
    "training_dot_general",
    "training_dot_general_cls",
    "training_operands",
]


def __getattr__(name: str):
    # `lowp_jax.nnx` / `lowp_jax.linen` without importing flax for users who never use it.
    if name in ("nnx", "linen"):
        return importlib.import_module(f"lowp_jax.{name}")
    raise AttributeError(f"module 'lowp_jax' has no attribute {name!r}")
