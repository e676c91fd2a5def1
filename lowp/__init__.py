"""lowp: low-precision numerics defined once, bit-exact across NumPy, PyTorch and JAX.

This package is the backend-neutral core and the NumPy reference implementation.
"""

from lowp._formats import ELEMENT_FORMATS, FORMATS, SCALE_FORMATS, Format, decode, encode
from lowp._interchange import load, load_activations, read_arrays, save
from lowp._layouts import from_cublas_blocked, pack_fp4, to_cublas_blocked, unpack_fp4
from lowp._qtensor import QTensor
from lowp._quantize import dequantize, quantize
from lowp._recipes import GemmSpec, InferenceConfig, Recipe
from lowp._rounding import random_bits
from lowp._schemes import (
    AxisScaling,
    BlockScaling,
    GroupScaling,
    MXScaling,
    NVFP4Scaling,
    Scheme,
    TensorScaling,
)

__all__ = [
    "AxisScaling",
    "BlockScaling",
    "ELEMENT_FORMATS",
    "GroupScaling",
    "FORMATS",
    "Format",
    "GemmSpec",
    "InferenceConfig",
    "MXScaling",
    "NVFP4Scaling",
    "QTensor",
    "Recipe",
    "SCALE_FORMATS",
    "Scheme",
    "TensorScaling",
    "decode",
    "dequantize",
    "encode",
    "from_cublas_blocked",
    "load",
    "load_activations",
    "pack_fp4",
    "quantize",
    "random_bits",
    "read_arrays",
    "save",
    "to_cublas_blocked",
    "unpack_fp4",
]
