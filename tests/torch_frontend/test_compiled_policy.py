"""The small-shape policy's device check traces under torch.compile (fullgraph)."""

import pytest
import torch

import lowp
from lowp_torch import _gemm, _training


@pytest.mark.parametrize(
    "capability, recipe, runs",
    [
        ((9, 0), "float8_tensorwise", True),
        ((8, 9), "float8_rowwise", True),
        ((8, 0), "float8_tensorwise", False),
        ((9, 0), "mxfp8", False),
        ((10, 0), "mxfp8", True),
    ],
)
def test_fp8_kernels_run_traces_with_a_cuda_device(monkeypatch, capability, recipe, runs):
    """A CUDA device's capability is a constant to the compiled code, compared as ints
    (torch 2.11's Dynamo failed on the tuple comparison; faked here, no GPU needed)."""

    @torch.compiler.assume_constant_result
    def fake_capability(index):
        return capability

    monkeypatch.setattr(_gemm, "_cuda_capability", fake_capability)
    lowering = _training.Lowering()
    device = torch.device("cuda", 0)
    recipe = lowp.Recipe.of(recipe)

    @torch.compile(fullgraph=True, backend="eager")
    def decide(x):
        return x + 1 if _training.fp8_kernels_run(recipe, device, lowering) else x - 1

    torch._dynamo.reset()
    assert decide(torch.zeros(2)).tolist() == ([1.0, 1.0] if runs else [-1.0, -1.0])
