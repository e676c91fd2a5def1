"""Root conftest: the frontends' doctests are collected only where their framework is.

`python -m pytest` collects doctests from lowp_torch/ and lowp_jax/ (pyproject
testpaths); on a machine without torch or jax those packages cannot import, so their
files are left out here, the same way tests/torch_frontend and tests/jax_frontend skip themselves.
"""

import importlib.util
import pathlib

_ROOT = pathlib.Path(__file__).parent


def _installed(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None  # not a bare namespace folder


_MISSING = [_ROOT / pkg for pkg, framework in (("lowp_torch", "torch"), ("lowp_jax", "jax")) if not _installed(framework)]


def pytest_ignore_collect(collection_path: pathlib.Path, config):
    if any(collection_path == p or p in collection_path.parents for p in _MISSING):
        return True
    return None
