"""The lowp_torch tests run only where torch is installed; elsewhere the folder skips."""

import os
import sys

import pytest

# The folder is not called "torch": with tests/ on sys.path (pytest's default import
# mode) it would import as a namespace package of that name where torch is absent.
pytest.importorskip("torch")

# torch_cases.py sits beside the tests and is shared with gpu_conformance.py; make it
# importable whatever pytest's import mode.
sys.path.insert(0, os.path.dirname(__file__))

# Not test modules: keep --doctest-modules from importing them (gpu_conformance.py is a
# script, and a same-named script in another frontend's folder would clash by basename).
collect_ignore = ["gpu_conformance.py", "torch_cases.py"]
