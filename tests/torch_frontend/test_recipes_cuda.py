"""The blockwise float8 and NVFP4 recipes on CUDA (spec §8): every GEMM operand, the
Hadamard-transformed and stochastically rounded ones included, is NumPy's bytes in eager
mode and under torch.compile, and a compiled layer's step equals the eager one's. On
sm_90 the blockwise GEMMs' kernels are `test_torch_training.py::
test_blockwise_gemms_run_on_scaled_mm_on_sm90`. The CPU run skips this file:

    python -m pytest -q tests/torch_frontend/test_recipes_cuda.py      # on a GPU
"""

import numpy as np
import pytest

import lowp
from lowp.extend import LinearPlan

torch = pytest.importorskip("torch")
import lowp_torch

RECIPES = ["float8_blockwise", "float8_blockwise_ue8m0", "nvfp4"]
# M, K, N: blockwise tiles of 128 partial along N (N = 320), nvfp4's 16s everywhere
M, K, N = 256, 256, 320
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _arrays(seed=0):
    """x (M, K), w (N, K), g (M, N): bf16 values, as float32 NumPy arrays."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, K))
    x[::64] *= 30  # outlier tokens: blocks the Hadamard transform spreads
    w = rng.standard_normal((N, K)) * 0.05
    g = rng.standard_normal((M, N)) * 1e-3
    return {
        k: torch.from_numpy(v.astype(np.float32)).bfloat16().float().numpy()
        for k, v in (("x", x), ("w", w), ("g", g))
    }


def _reference(arrays, recipe) -> dict:
    """NumPy's operands of each GEMM (`OperandPlan.quantize_reference`)."""
    x, w, g = arrays["x"], arrays["w"], arrays["g"]
    plan = LinearPlan.of(lowp.Recipe.from_name(recipe))
    tensors = {"forward": (x, w), "dgrad": (g, w.T), "wgrad": (g.T, x.T)}
    return {
        gemm: tuple(
            op.quantize_reference(np.ascontiguousarray(t))
            for op, t in zip((getattr(plan, gemm).a, getattr(plan, gemm).b), pair, strict=True)
        )
        for gemm, pair in tensors.items()
    }


def check_operands(device: str, recipe: str, compiled: bool) -> None:
    """`lowp_torch.training_operands` of bf16 tensors on `device` (compiled or eager)
    against NumPy's bytes, codes, scales and global scales, GEMM by GEMM."""
    arrays = _arrays()
    t = [torch.from_numpy(arrays[k]).bfloat16().to(device) for k in ("x", "w", "g")]
    fn = lowp_torch.training_operands
    if compiled:
        fn = torch.compile(fn, dynamic=False)
    got = fn(*t, recipe)
    for gemm, pair in _reference(arrays, recipe).items():
        for side, q, want in zip("ab", got[gemm], pair, strict=True):
            where = f"{recipe} {device} {'compiled' if compiled else 'eager'} {gemm}.{side}"
            q = lowp_torch.to_lowp(q)
            assert q.scheme == want.scheme, where
            assert q.codes.tobytes() == want.codes.tobytes(), f"{where}: codes"
            assert q.scale.tobytes() == want.scale.tobytes(), f"{where}: scales"
            if want.global_scale is not None:
                assert q.global_scale.tobytes() == want.global_scale.tobytes(), where


@needs_cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("recipe", RECIPES + list(lowp.Recipe.ablation_names()))
def test_cuda_operands_are_numpys_bytes(recipe, compiled):
    check_operands("cuda", recipe, compiled)


@needs_cuda
@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_compiled_step_equals_eager(recipe):
    """y, dx, dw of a compiled layer equal the eager layer's bit for bit: the same
    operand bytes (above) into the same GEMMs."""
    arrays = _arrays(1)
    x, w, g = (torch.from_numpy(arrays[k]).bfloat16().cuda() for k in ("x", "w", "g"))
    # small_shapes="quantize": the policy would run a shape this small in bf16 on an H200
    layer = lowp_torch.Linear(
        K, N, bias=False, recipe=recipe, dtype=torch.bfloat16, small_shapes="quantize"
    ).cuda()
    with torch.no_grad():
        layer.weight.copy_(w)

    def step(module):
        layer.zero_grad()
        xg = x.clone().requires_grad_()
        y = module(xg)
        y.backward(g)
        return y.detach().clone(), xg.grad, layer.weight.grad.clone()

    eager = step(layer)
    compiled = step(torch.compile(layer, fullgraph=True))
    for name, e, c in zip(("y", "dx", "dw"), eager, compiled, strict=True):
        assert torch.equal(e, c), f"{recipe}: compiled {name} differs from eager"
