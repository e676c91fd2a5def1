"""The planned call of a quantize_'d linear (`_linear._plan`) against the general path.

The planned path runs only where the Triton casts and `torch._scaled_mm` run (CUDA), so
here both are made to run on the CPU: the kernel check answers as on CUDA, and the
Triton launch is replaced by the torch-ops cast's bytes (the same bytes, tested
elsewhere). What is tested is what the plan keeps: the weight operand, the scales'
shapes, the bias and output handling, which must give the general path's bytes.
"""

import pytest

torch = pytest.importorskip("torch")
# the planned call runs where the Triton casts do: without triton it is never made
pytest.importorskip("triton", reason="triton is not installed: no call is planned")

import lowp
import lowp_torch
from lowp_torch import _cast_kernels, _gemm, _linear, _quantize, _triton_casts


def _cpu_scaled_mm_takes_rows() -> bool:
    """Whether this torch's CPU `torch._scaled_mm` takes rowwise scales (2.13's does;
    2.11's takes one scale a tensor), which the planned rowwise call runs here."""
    a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
    try:
        torch._scaled_mm(
            a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16
        )
    except (RuntimeError, NotImplementedError):
        return False
    return True


ROWS_ON_CPU = _cpu_scaled_mm_takes_rows()


@pytest.fixture
def cuda_path(monkeypatch):
    """The CUDA Python path on CPU tensors; returns the list of planned calls' results."""
    real_problem, real_triton = _gemm.kernel_problem, _cast_kernels.triton_problem

    def kernel_problem(kernel, a, b, form, out_dtype):
        if kernel == "scaled_mm" and form in ("tensorwise", "rowwise") and a.dim() == b.dim() == 2:
            return None
        return real_problem(kernel, a, b, form, out_dtype)

    def triton_problem(t, scheme, *args, **kwargs):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            problem = real_triton(t.to("meta"), scheme, *args, **kwargs)
            return None if problem == "the input is on meta, not CUDA" else problem
        return real_triton(t, scheme, *args, **kwargs)

    def launch(x, shape, scheme, fmt):  # the Triton cast's (uint8 codes, flat scales)
        with _cast_kernels.cast_kernels("torch"):
            q = _quantize.quantize(x, scheme)
        return q.codes.view(torch.uint8), q.scale.reshape(-1)

    planned = []
    real_planned = _linear._planned

    def spy(x, bias, plan):
        y = real_planned(x, bias, plan)
        planned.append(y is not None)
        return y

    monkeypatch.setattr(_gemm, "kernel_problem", kernel_problem)
    monkeypatch.setattr(_gemm, "_cuda_capability", lambda index: (9, 0))
    monkeypatch.setattr(_cast_kernels, "triton_problem", triton_problem)
    monkeypatch.setattr(_triton_casts, "_launch", launch)
    monkeypatch.setattr(_linear, "_planned", spy)
    return planned


@pytest.mark.parametrize("preset", ["float8_rowwise", "float8_tensorwise"])
@pytest.mark.parametrize("shape", [(1, 64), (16, 64), (2, 3, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_planned_call_gives_the_general_paths_bytes(cuda_path, preset, shape, bias):
    if preset == "float8_rowwise" and not ROWS_ON_CPU:
        pytest.skip(f"torch {torch.__version__}'s CPU _scaled_mm takes no rowwise scales")
    torch.manual_seed(0)
    layer = lowp_torch.quantize_(torch.nn.Linear(64, 32, bias=bias, dtype=torch.bfloat16), preset)
    x = torch.randn(shape, dtype=torch.bfloat16)
    with torch.inference_mode():
        first = layer(x)  # makes the plan (general path)
        second = layer(x)  # planned
    assert cuda_path == [True], cuda_path  # the first call plans, the second runs it
    assert "_lowp_plans" in layer.weight.__dict__
    expected = _linear._quantized_input(x, layer.weight, layer.bias, layer.weight.linear)
    for y in (first, second):
        assert y.shape == (*shape[:-1], 32) and y.dtype == torch.bfloat16
        assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


def test_a_tensor_scaled_input_beside_a_rowwise_weight_keeps_the_general_path(cuda_path):
    """gemm_form calls the pair rowwise; its one input scale would need expanding to
    (M, 1) at every call, so it is not planned (a review found the planned call refused
    by torch._scaled_mm from the second call on)."""
    if not ROWS_ON_CPU:
        pytest.skip(f"torch {torch.__version__}'s CPU _scaled_mm takes no rowwise scales")
    config = lowp.InferenceConfig(weight=lowp.AxisScaling(), activation=lowp.TensorScaling())
    layer = lowp_torch.quantize_(torch.nn.Linear(64, 32, dtype=torch.bfloat16), config)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        first, second = layer(x), layer(x)
    assert cuda_path == [] and "_lowp_plans" not in layer.weight.__dict__
    expected = _linear._quantized_input(x, layer.weight, layer.bias, layer.weight.linear)
    for y in (first, second):
        assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


def test_plan_is_remade_when_the_weight_parts_change(cuda_path):
    layer = lowp_torch.quantize_(torch.nn.Linear(64, 32, dtype=torch.bfloat16), "float8_tensorwise")
    other = lowp_torch.quantize_(torch.nn.Linear(64, 32, dtype=torch.bfloat16), "float8_tensorwise")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        layer(x)
        layer(x)
    layer.load_state_dict(other.state_dict())
    with torch.inference_mode():
        y = layer(x)
        expected = other(x)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))


def test_general_path_where_the_call_needs_it(cuda_path):
    """Grad, autocast and cast_kernels("torch") take the general path, plan or not."""
    layer = lowp_torch.quantize_(torch.nn.Linear(64, 32, dtype=torch.bfloat16), "float8_tensorwise")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        layer(x)
    cuda_path.clear()
    xg = x.clone().requires_grad_(True)
    layer(xg).sum().backward()  # the straight-through gradient
    assert xg.grad is not None
    with torch.inference_mode(), _cast_kernels.cast_kernels("torch"):
        layer(x)
    assert cuda_path == [False, False]
