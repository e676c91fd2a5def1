"""Root conftest: the frontends' doctests are collected only where their framework is.

`python -m pytest` collects doctests from lowp_torch/ and lowp_jax/ (pyproject
testpaths); on a machine without torch or jax (or triton, for lowp_torch's Triton
kernels) those modules cannot import, so their
files are left out here, the same way tests/torch_frontend and tests/jax_frontend skip themselves.
"""

import importlib.util
import pathlib

_ROOT = pathlib.Path(__file__).parent


def _installed(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None  # not a bare namespace folder


# Paths whose import needs a framework: the frontends, and lowp_jax's flax modules.
_NEEDS = (
    ("lowp_torch", "torch"),
    ("lowp_jax", "jax"),
    ("lowp_jax/nnx.py", "flax"),
    ("lowp_jax/linen.py", "flax"),
    ("lowp_jax/models", "flax"),
    ("lowp_torch/_triton_casts.py", "triton"),
    ("lowp_torch/_triton_kernels.py", "triton"),
)
_MISSING = [_ROOT / path for path, framework in _NEEDS if not _installed(framework)]


def pytest_ignore_collect(collection_path: pathlib.Path, config):
    if any(collection_path == p or p in collection_path.parents for p in _MISSING):
        return True
    return None
