"""lowp: low-precision numerics defined once, bit-exact across NumPy, PyTorch and JAX.

This package is the backend-neutral core and the NumPy reference implementation.
"""

from importlib import metadata as _metadata

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
    NVFP4TileScaling,
    Scheme,
    TensorScaling,
)


def _source_version() -> str:
    """The version in pyproject.toml beside an uninstalled source tree, else "0+unknown"."""
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        with pyproject.open("rb") as f:
            project = tomllib.load(f)["project"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "0+unknown"
    return project["version"] if project.get("name") == "lowp" else "0+unknown"


try:
    __version__ = _metadata.version("lowp")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = _source_version()

__all__ = [
    "ELEMENT_FORMATS",
    "FORMATS",
    "SCALE_FORMATS",
    "AxisScaling",
    "BlockScaling",
    "Format",
    "GemmSpec",
    "GroupScaling",
    "InferenceConfig",
    "MXScaling",
    "NVFP4Scaling",
    "NVFP4TileScaling",
    "QTensor",
    "Recipe",
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
