"""The JAX conformance tests run only where jax is installed; elsewhere the folder skips."""

import os
import sys

import pytest

# The folder is not called "jax": with tests/ on sys.path (pytest's default import
# mode) it would import as a namespace package of that name where jax is absent.
pytest.importorskip("jax")

# jax_cases.py sits beside the tests and is shared with gpu_conformance.py; make it
# importable whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(__file__))
