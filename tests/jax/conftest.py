"""The JAX conformance tests run only where jax is installed; elsewhere the folder skips."""

import importlib.util
import os
import sys

import pytest

# Without jax installed, `import jax` could find this very folder (tests/jax, once tests/ is
# on sys.path) as a namespace package and "succeed"; a real jax has a file origin.
_spec = importlib.util.find_spec("jax")
if _spec is None or _spec.origin is None:
    pytest.skip("jax is not installed", allow_module_level=True)
pytest.importorskip("jax")

# jax_cases.py sits beside the tests and is shared with gpu_conformance.py; make it
# importable whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(__file__))
