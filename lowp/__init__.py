"""lowp: low-precision numerics defined once, bit-exact across NumPy, PyTorch and JAX.

This package is the backend-neutral core and the NumPy reference implementation; the
frontends `lowp_torch` and `lowp_jax` give its bytes on their own arrays. The contract
every backend meets is docs/numerics.md ("spec §N" in the docstrings is its section N).

Formats (spec §1): `FORMATS` maps each name to its `Format` (bits, bias, max, NaN and Inf
codes); `ELEMENT_FORMATS` holds the element formats, `SCALE_FORMATS` the scale formats
(float32 is a scale format without a `Format` entry); `encode` and `decode` convert
between float32 values and codes.

Schemes (spec §3), frozen dataclasses that check their fields: `TensorScaling`,
`AxisScaling`, `BlockScaling`, `GroupScaling` (float32 scales), `MXScaling` (e8m0
scales) and `NVFP4Scaling`; `Scheme` is any of them.

The reference: `quantize(x, scheme)` gives a `QTensor` of codes and scales,
`dequantize` inverts it; `random_bits` are the bits of stochastic rounding (spec §4).
Layouts (spec §5): `pack_fp4` / `unpack_fp4`, `to_cublas_blocked` /
`from_cublas_blocked`. Recipes (spec §8): `Recipe` (training, one `GemmSpec` per GEMM)
and `InferenceConfig` (weight and activation schemes), each with named presets
(`from_name`, `names`). The interchange file (spec §9): `save`, `load`, `read_arrays`,
`load_activations`.

>>> import numpy as np, lowp
>>> q = lowp.quantize(np.array([1.0, -2.0, 448.0], np.float32), lowp.TensorScaling())
>>> q.codes.view(np.uint8).tolist(), q.scale.tolist(), lowp.dequantize(q).tolist()
([56, 192, 126], 1.0, [1.0, -2.0, 448.0])
"""

from importlib import metadata as _metadata

from lowp import checkpoints
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
    "checkpoints",
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
