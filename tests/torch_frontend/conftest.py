"""The lowp_torch tests run only where torch is installed; elsewhere the folder skips."""

import pytest

# The folder is not called "torch": with tests/ on sys.path (pytest's default import
# mode) it would import as a namespace package of that name where torch is absent.
pytest.importorskip("torch")

# A script, not a test module: keep --doctest-modules from importing it (a same-named
# script in another frontend's folder would clash by basename).
collect_ignore = ["gpu_conformance.py"]
