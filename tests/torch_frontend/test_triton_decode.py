"""The decode kernel (`lowp_torch._triton_decode`) and its planned call, against the
reference's bytes and spec §7's bound.

Under Triton's CPU interpreter, in subprocesses started with TRITON_INTERPRET=1 (triton
reads it when a kernel is defined; see test_triton_casts.py):

- the kernel: for float8_tensorwise's and float8_rowwise's activation schemes (and a
  pow2 one), M = 1, 3 and MAX_M, K and N that leave partial tiles, float32, bfloat16 and
  float16 inputs, with and without a bias, the default configuration and split-K and
  tensor-core ones: the activation codes and scales the kernel multiplies equal
  `lowp.quantize`'s (the NumPy reference) byte for byte, the output is within §7's
  bound of the float64 product of the dequantized operands, a zero row gives the bias
  exactly, a second call gives the same bytes, and a poisoned (NaN) group gives NaN;
- the planned call (`_linear._planned`) with the CUDA checks answered as on CUDA (as
  test_planned_inference.py does): quantize_'d Linears of both presets take the kernel
  for 1..MAX_M rows, within the bound, and `torch._scaled_mm` above, with the general
  path's bytes;
- the `lowp::decode_linear` op (what a compiled graph calls), through `opcheck`.

The interpreter cannot show GPU numerics (the native fp8 conversions, tensor cores) nor
the bound launch; `test_decode_on_cuda` does, on a GPU. Without one,
`test_kernel_lowers_for_sm90` compiles each form for sm_90 (Triton's lowering and
ptxas run on the CPU).
"""

import importlib.util
import textwrap

import pytest
import torch

import lowp
import lowp_torch
from tests.torch_frontend.test_triton_casts import _run_interpreted

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")

_KERNEL = textwrap.dedent(
    """
    import numpy as np, torch, lowp, lowp_torch
    from lowp_torch import _triton_decode as D
    from tests.torch_frontend.test_torch_gemm import check_bound, exact_product, sqnr_db

    def reference(x, scheme):
        q = lowp.quantize(x.float().numpy(), scheme)
        return torch.from_numpy(np.asarray(q.codes).view(np.uint8)), np.asarray(q.scale).ravel()

    gen = torch.Generator().manual_seed(0)
    k, n = 100, 40  # K past a whole number of 32-wide steps, N past 16-row tiles
    configs = {
        1: [None, D.Config(16, 32, 2), D.Config(16, 32, 1, num_warps=1)],
        3: [None, D.Config(16, 32, 4, use_dot=True)],
        D.MAX_M: [None, D.Config(32, 64, 2, use_dot=True)],
    }
    schemes = [lowp.TensorScaling(), lowp.AxisScaling(), lowp.AxisScaling(pow2=True)]
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    case = 0
    for scheme in schemes:
        rowwise = isinstance(scheme, lowp.AxisScaling)
        for m, choices in configs.items():
            for config in choices:
                hp = dtypes[case % 3]
                with_bias = case % 2 == 0
                case += 1
                x = torch.randn(m, k, generator=gen).to(hp)
                x[0] = 0  # an all-zero row: the bias, not NaN
                w = lowp_torch.quantize(torch.randn(n, k, generator=gen), scheme)
                w_codes, w_scale = w.codes.view(torch.uint8), w.scale.reshape(-1)
                bias = torch.randn(n, generator=gen).to(hp) if with_bias else None
                decode = D.Decode(n, k, hp, x.device, scheme, rowwise)
                y, codes, scales = D.activation_codes(decode, x, w_codes, w_scale, bias, config)
                ref_codes, ref_scales = reference(x, scheme)
                assert torch.equal(codes, ref_codes), (scheme, m, config)
                assert scales.numpy().tobytes() == ref_scales.astype(np.float32).tobytes()
                a = lowp_torch.quantize(x, scheme)
                y_exact, mass = exact_product(a, w, bias)
                assert y.dtype == hp and y.shape == (m, n)
                assert sqnr_db(y, y_exact) >= 40, (scheme, m, config)
                check_bound(y, y_exact, mass, k)
                zero = torch.zeros(n, dtype=hp) if bias is None else bias
                assert torch.equal(y[0], zero)
                again = decode(x, w_codes, w_scale, bias, config=config)
                assert torch.equal(again.view(torch.uint8), y.view(torch.uint8))
    for scheme in schemes[:2]:
        x = torch.randn(4, k, generator=gen)
        x[2, 5] = float("nan")  # poisons row 2 (rowwise) or the whole tensor (tensorwise)
        w = lowp_torch.quantize(torch.randn(n, k, generator=gen), scheme)
        decode = D.Decode(n, k, x.dtype, x.device, scheme, isinstance(scheme, lowp.AxisScaling))
        y = decode(x, w.codes.view(torch.uint8), w.scale.reshape(-1))
        poisoned = torch.isnan(y).all(dim=1).tolist()
        expected = [False, False, True, False] if isinstance(scheme, lowp.AxisScaling) else [True] * 4
        assert poisoned == expected, poisoned
    print('"kernel ok"')  # the JSON line _run_interpreted reads
    """
)


_PLANNED = textwrap.dedent(
    """
    import torch, lowp, lowp_torch
    from lowp_torch import _cast_kernels, _gemm, _linear, _quantize, _triton_casts, _triton_decode
    from tests.torch_frontend.test_planned_inference import ROWS_ON_CPU
    from tests.torch_frontend.test_torch_gemm import check_bound, exact_product

    # the CUDA checks answered as on CUDA (tests/torch_frontend/test_planned_inference.py)
    real_problem, real_triton = _gemm.kernel_problem, _cast_kernels.triton_problem

    def kernel_problem(kernel, a, b, form, out_dtype):
        if kernel == "scaled_mm" and form in ("tensorwise", "rowwise") and a.dim() == b.dim() == 2:
            return None
        return real_problem(kernel, a, b, form, out_dtype)

    def triton_problem(t, scheme, *args, **kwargs):
        problem = real_triton(t.to("meta"), scheme, *args, **kwargs)
        return None if problem == "the input is on meta, not CUDA" else problem

    _gemm.kernel_problem, _cast_kernels.triton_problem = kernel_problem, triton_problem
    _gemm._cuda_capability = lambda index: (9, 0)
    decoded = []
    real_call = _triton_decode.Decode.__call__

    def spy(self, x, *args, **kwargs):
        decoded.append(x.shape[0])
        return real_call(self, x, *args, **kwargs)

    _triton_decode.Decode.__call__ = spy
    torch.manual_seed(0)
    for preset in ("float8_rowwise", "float8_tensorwise"):
        for bias in (True, False):
            layer = torch.nn.Linear(80, 48, bias=bias, dtype=torch.bfloat16)
            lowp_torch.quantize_(layer, preset)
            for shape in ((1, 80), (1, 3, 80), (_triton_decode.MAX_M, 80), (_triton_decode.MAX_M + 1, 80)):
                if preset == "float8_rowwise" and not ROWS_ON_CPU:
                    continue  # the general path: no rowwise scales in this CPU _scaled_mm
                x = torch.randn(shape, dtype=torch.bfloat16)
                decoded.clear()
                with torch.inference_mode():
                    first, second = layer(x), layer(x)  # the general path plans, then planned
                rows = x.numel() // 80
                # the layer's first call plans (general path); every later one is planned
                assert decoded in (([rows], [rows, rows]) if rows <= _triton_decode.MAX_M else ([],)), decoded
                assert second.shape == (*shape[:-1], 48) and second.dtype == torch.bfloat16
                general = _linear._quantized_input(x, layer.weight, layer.bias, layer.weight.linear)
                if rows > _triton_decode.MAX_M:
                    assert torch.equal(second.view(torch.int16), general.view(torch.int16))
                a = lowp_torch.quantize(x.reshape(rows, 80), layer.weight.linear.activation)
                y_exact, mass = exact_product(a, layer.weight, layer.bias)
                check_bound(second.reshape(rows, 48), y_exact, mass, 80)
    print('"planned ok"')
    """
)


_OP = textwrap.dedent(
    """
    import torch, lowp, lowp_torch
    from lowp_torch import _cast_ops

    gen = torch.Generator().manual_seed(0)
    for scheme in (lowp.TensorScaling(), lowp.AxisScaling()):
        w = lowp_torch.quantize(torch.randn(24, 40, generator=gen), scheme)
        x = torch.randn(2, 40, generator=gen).to(torch.bfloat16)
        bias = torch.randn(24, generator=gen).to(torch.bfloat16)
        args = (x, w.codes.view(torch.uint8), w.scale.reshape(-1), bias, _cast_ops.scheme_key(scheme))
        torch.library.opcheck(torch.ops.lowp.decode_linear, args)
    # the launch a compiled graph makes (the triton_op's body on a GPU), split K 16 ways
    # at this shape, gives the eager call's bytes
    from lowp_torch import _decode_op
    w = lowp_torch.quantize(torch.randn(32, 4096, generator=gen), lowp.AxisScaling())
    x = torch.randn(1, 4096, generator=gen).to(torch.bfloat16)
    codes, scale = w.codes.view(torch.uint8), w.scale.reshape(-1)
    decode = _decode_op._decode_of(32, 4096, x.dtype, x.device, _cast_ops.scheme_key(lowp.AxisScaling()), True)
    from lowp_torch import _triton_decode
    assert _triton_decode.default_config(1, 32, 4096, decode.programs).split_k > 1
    traced = decode.traced_call(x, codes, scale, None)
    assert torch.equal(traced.view(torch.int16), decode(x, codes, scale).view(torch.int16))
    print('"op ok"')
    """
)


_COMPILED = textwrap.dedent(
    """
    import torch, lowp, lowp_torch
    from lowp_torch import _triton_decode

    decoded = []
    real_call = _triton_decode.Decode.__call__

    def spy(self, x, *args, **kwargs):
        decoded.append(x.shape[0])
        return real_call(self, x, *args, **kwargs)

    _triton_decode.Decode.__call__ = spy
    torch.manual_seed(0)
    for preset in ("float8_rowwise", "float8_tensorwise"):
        layer = torch.nn.Linear(64, 32, dtype=torch.bfloat16)
        lowp_torch.quantize_(layer, preset)
        w = layer.weight
        decode = _triton_decode.Decode(
            32, 64, torch.bfloat16, torch.device("cpu"), w.linear.activation, w.scale.numel() != 1
        )
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True, dynamic=False)
        for shape in ((1, 64), (2, 3, 64)):
            x = torch.randn(shape, dtype=torch.bfloat16)
            decoded.clear()
            with torch.inference_mode():
                y = compiled(x)
            assert decoded == [x.numel() // 64] and y.shape == (*shape[:-1], 32), decoded
            rows = x.reshape(-1, 64)
            eager = decode(rows, w.codes.view(torch.uint8), w.scale.reshape(-1), layer.bias)
            assert torch.equal(y.reshape(-1, 32).view(torch.int16), eager.view(torch.int16))
    print('"compiled ok"')
    """
)


@pytest.mark.slow
@needs_triton
def test_kernel_gives_the_reference_bytes_and_the_gemm_bound_under_the_interpreter():
    assert _run_interpreted(_KERNEL, timeout=900) == "kernel ok"


@pytest.mark.slow
@needs_triton
def test_planned_call_takes_the_kernel_up_to_max_m_under_the_interpreter():
    assert _run_interpreted(_PLANNED, timeout=900) == "planned ok"


@pytest.mark.slow
@needs_triton
def test_decode_op_passes_opcheck_under_the_interpreter():
    assert _run_interpreted(_OP, timeout=900) == "op ok"


@pytest.mark.slow
@needs_triton
def test_compiled_call_takes_the_decode_op_under_the_interpreter():
    assert _run_interpreted(_COMPILED, timeout=900) == "compiled ok"


def _compile_for_sm90(m, n, k, config, rowwise, has_bias, kernel=None):
    """The kernel (or `kernel`, a copy of it) compiled for an sm_90 GPU, here without one:
    Triton's lowering to PTX and ptxas run on the CPU (no launch)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lowp_torch import _triton_decode as D

    scheme = lowp.AxisScaling() if rowwise else lowp.TensorScaling()
    decode = D.Decode(n, k, torch.bfloat16, torch.device("cpu"), scheme, rowwise)
    constexprs = decode.constexprs(m, config, has_bias, False, native=True)
    pointers = {"x_ptr": "*bf16", "w_ptr": "*u8", "w_scale_ptr": "*fp32", "bias_ptr": "*bf16"}
    pointers |= {"y_ptr": "*bf16", "partial_ptr": "*fp32", "count_ptr": "*i32"}
    pointers |= {"codes_ptr": "*u8", "scale_ptr": "*fp32", "N": "i32", "K": "i32"}
    names = D.decode_linear_kernel.arg_names
    signature = {name: pointers.get(name, "constexpr") for name in names}
    aligned = ("w_ptr", "w_scale_ptr", "partial_ptr", "count_ptr", "N", "K")
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(
        kernel or D.decode_linear_kernel,
        signature,
        {(names.index(name),): v for name, v in constexprs.items()},
        attrs,
    )
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


@needs_triton
def test_kernel_source_inductor_rebuilds_defines_every_helper():
    """The fast tier's half of the test below, without compiling: Inductor's rebuilt
    source of the decode kernel defines each JIT function the kernel calls."""
    from torch._inductor.codegen.wrapper import (
        user_defined_triton_kernel_transitive_closure_source_code as rebuilt_source,
    )

    from lowp_torch import _triton_decode as D

    source = rebuilt_source(D.decode_linear_kernel)
    for helper in ("_load", "_abs_bits", "_float_scale", "_encode", "_values", "_epilogue"):
        assert f"def {helper}(" in source, helper
    assert "_tk." not in source


@pytest.mark.slow
@needs_triton
def test_kernel_source_inductor_rebuilds_compiles(tmp_path):
    """Under torch.compile the decode op's kernel is launched by Inductor, which rebuilds
    its source from the JIT functions and constants the kernel's globals name; what that
    source leaves out fails only on a GPU, in Inductor's compile worker (a helper called
    through a module alias once did). Here the rebuilt source, behind only the imports
    Triton itself needs, compiles for sm_90."""
    import importlib.util

    from torch._inductor.codegen.wrapper import (
        user_defined_triton_kernel_transitive_closure_source_code as rebuilt_source,
    )

    from lowp_torch import _triton_decode as D

    path = tmp_path / "rebuilt_decode.py"
    header = "import triton\nimport triton.language as tl\n\n@triton.jit\n"
    path.write_text(header + rebuilt_source(D.decode_linear_kernel))
    spec = importlib.util.spec_from_file_location("rebuilt_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for m in (1, 16):
        config = D.default_config(m, 4096, 4096, 4 * 132)
        kernel = module.decode_linear_kernel
        compiled = _compile_for_sm90(m, 4096, 4096, config, m == 1, m > 1, kernel=kernel)
        assert "cvt.rn.f16x2.e4m3x2" in compiled.asm["ptx"]


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize(
    "m, config",
    [
        (1, None),  # the defaults of each form
        (16, None),
        (1, (16, 128, 1, True)),  # tensor cores at one row, a narrow tile
        (4, (64, 64, 4, True)),
    ],
)
def test_kernel_lowers_for_sm90(m, config):
    """Every form compiles for the H100/H200 (Triton 3.6's lowering of the tensor-core
    form once failed an assertion for tiles the amax pass did not share)."""
    from lowp_torch import _triton_decode as D

    n, k = 4096, 4096
    cfg = (
        D.default_config(m, n, k, 4 * 132)
        if config is None
        else D.Config(*config[:3], use_dot=config[3])
    )
    compiled = _compile_for_sm90(m, n, k, cfg, rowwise=m % 2 == 1, has_bias=m > 1)
    ptx = compiled.asm["ptx"]
    assert "cvt.rn.f16x2.e4m3x2" in ptx  # the native fp8 conversion of the codes
    assert ("mma.sync" in ptx) == cfg.use_dot


@needs_triton
def test_config_refuses_what_the_kernel_does_not_take():
    from lowp_torch import _triton_decode as D

    with pytest.raises(ValueError, match="block_n must be a power of two, got 24"):
        D.Config(24, 128, 1)
    with pytest.raises(ValueError, match="split_k must be at most"):
        D.Config(16, 128, 2 * D.MAX_SPLIT_K)
    with pytest.raises(ValueError, match="use_dot needs block_n, block_k >= 16, got 8"):
        D.Config(8, 128, 1, use_dot=True)
    with pytest.raises(ValueError, match="float8_e5m2"):
        D.Decode(
            32, 64, torch.bfloat16, torch.device("cpu"), lowp.TensorScaling("float8_e5m2"), False
        )


@needs_triton
def test_bound_launch_passes_the_kernels_leading_arguments():
    from lowp_torch import _linear
    from lowp_torch import _triton_decode as D

    assert tuple(D.decode_linear_kernel.arg_names[: len(D._CALL_ARGS)]) == D._CALL_ARGS
    assert _linear._DECODE_MAX_M == D.MAX_M


@needs_triton
@pytest.mark.parametrize(
    "m, n, k, split",
    [
        (1, 14336, 4096, 1),
        (1, 4096, 4096, 2),
        (1, 1024, 4096, 8),
        (1, 4096, 14336, 2),
        (16, 1024, 4096, 16),
    ],
)
def test_default_config_fills_the_device(m, n, k, split):
    """On an H100 (132 SMs, 528 programs wanted): K split while the grid has at most half."""
    from lowp_torch import _triton_decode as D

    config = D.default_config(m, n, k, programs=4 * 132)
    assert config.split_k == split
    assert config.use_dot == (m > 1)


def test_decode_problem_names_what_it_does_not_take():
    from lowp_torch import _linear

    layer = lowp_torch.quantize_(torch.nn.Linear(64, 32), "float8_tensorwise")
    w, config = layer.weight, layer.weight.linear
    assert "runs on CUDA" in _linear.decode_problem(w, config, "tensorwise")
    assert "kernel='scaled_mm'" in _linear.decode_problem(
        w, lowp_torch.LinearConfig(config.activation, kernel="scaled_mm"), "tensorwise"
    )


def test_decode_problem_refuses_a_gpu_before_sm89(monkeypatch):
    """The compiled path asks only `decode_problem` before emitting the decode op, so the
    capability check lives there, not in the eager plan's `_scaled_mm` check alone."""
    import types

    from lowp_torch import _gemm, _linear

    layer = lowp_torch.quantize_(torch.nn.Linear(64, 32), "float8_tensorwise")
    config = layer.weight.linear
    on_gpu = types.SimpleNamespace(codes=types.SimpleNamespace(device=torch.device("cuda", 0)))
    monkeypatch.setattr(_gemm, "_cuda_capability", lambda index: (8, 0))
    assert "need sm_89+, this GPU is sm_80" in _linear.decode_problem(on_gpu, config, "tensorwise")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("preset", ["float8_rowwise", "float8_tensorwise"])
def test_decode_on_cuda(preset):
    """The GPU's kernel (native conversions, tensor cores, the bound launch, split-K's
    counters) within the bound, repeatable, and compiled as eager."""
    from lowp_torch import _triton_decode as D
    from tests.torch_frontend.test_torch_gemm import check_bound, exact_product

    torch.manual_seed(0)
    layer = torch.nn.Linear(4096, 1024, dtype=torch.bfloat16, device="cuda")
    lowp_torch.quantize_(layer, preset)
    compiled = torch.compile(layer, dynamic=False)  # decode compiles for a static M
    for m in (1, 3, D.MAX_M):
        x = torch.randn(m, 4096, dtype=torch.bfloat16, device="cuda")
        with torch.inference_mode():
            ys = [layer(x) for _ in range(4)]  # plan, bind, then bound launches
            y_compiled = compiled(x)
        a = lowp_torch.quantize(x, layer.weight.linear.activation)
        y_exact, mass = exact_product(a, layer.weight, layer.bias)
        for y in ys[1:]:
            assert torch.equal(y, ys[1])
            check_bound(y, y_exact, mass, 4096)
        assert torch.equal(y_compiled, ys[1])


@needs_triton
def test_the_bound_launch_is_taken_unless_a_launch_hook_is_set():
    """Triton 3.6 keeps its launch hooks in a HookChain that is there even when empty: the
    decode call's bound launch (no Python argument binding) must not read it as a hook,
    or every call goes through Triton's `run` (80 us of host a call on the H200)."""
    from triton import knobs

    from lowp_torch import _triton_decode as D

    assert not D.launch_hooks_set()
    chain = knobs.runtime.launch_enter_hook
    if not hasattr(chain, "add"):
        pytest.skip("this Triton keeps one hook, not a HookChain")

    def hook(*args):
        return None

    chain.add(hook)
    try:
        assert D.launch_hooks_set()
    finally:
        chain.remove(hook)
    assert not D.launch_hooks_set()
