"""The JAX conformance tests run only where jax is installed; elsewhere the folder skips."""

import os
import sys

import pytest

pytest.importorskip("jax")

# jax_cases.py sits beside the tests and is shared with gpu_conformance.py; make it
# importable whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(__file__))
