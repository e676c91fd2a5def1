"""The conformance suite runs every backend of lowp_apps.conformance.backends; a backend
this machine lacks (no CUDA, no torch, no jax) skips with the reason."""

import pytest

from lowp_apps.conformance import backends


@pytest.fixture
def backend(request):
    """The backend named by the test's `backend` parameter (indirect), or a skip saying
    why this machine cannot run it."""
    found = backends.get(request.param)
    why = found.problem()
    if why is not None:
        pytest.skip(f"{found.name}: {why}")
    return found
