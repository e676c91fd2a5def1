"""The skinny decode GEMM prototype (`lowp_torch._triton_decode`) against spec §7.

Under Triton's CPU interpreter, in a subprocess started with TRITON_INTERPRET=1 (triton
reads it when a kernel is defined; see test_triton_casts.py): for the float8_tensorwise
and float8_rowwise scheme pairs, M from 1 to MAX_M, K and N that leave partial tiles,
float32 and bfloat16 outputs, with a bias, both this kernel and the emulated GEMM
(`scaled_matmul(kernel="emulated")`) within §7's bounds of the float64 product of the
dequantized operands, an all-zero row giving the bias exactly, and a poisoned (NaN)
group giving NaN.
"""

import importlib.util
import textwrap

import pytest

from tests.torch_frontend.test_triton_casts import _run_interpreted

HAS_TRITON = importlib.util.find_spec("triton") is not None

_SCRIPT = textwrap.dedent(
    """
    import torch, lowp, lowp_torch
    from lowp_torch import _triton_decode
    from tests.torch_frontend.test_torch_gemm import check_bound, exact_product, sqnr_db

    gen = torch.Generator().manual_seed(0)
    k, n = 96, 80  # a partial K chunk and a partial N tile
    for scheme in (lowp.TensorScaling(), lowp.AxisScaling()):
        for m in (1, 5, 16, 33, _triton_decode.MAX_M):
            for out_dtype in (torch.float32, torch.bfloat16):
                x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
                x[0] = 0  # an all-zero row: the bias, not NaN
                a, b = lowp_torch.quantize(x, scheme), lowp_torch.quantize(w, scheme)
                bias = torch.randn(n, generator=gen)
                y = _triton_decode.skinny_scaled_mm(a, b, out_dtype=out_dtype, bias=bias)
                emulated = lowp_torch.scaled_matmul(
                    a, b, out_dtype=out_dtype, bias=bias, kernel="emulated"
                )
                y_exact, mass = exact_product(a, b, bias)
                for result in (y, emulated):
                    assert result.dtype == out_dtype and result.shape == (m, n)
                    assert sqnr_db(result, y_exact) >= 40
                    check_bound(result, y_exact, mass, k)
                assert torch.equal(y[0], bias.to(out_dtype))
    x = torch.randn(4, k, generator=gen)
    x[2, 5] = float("nan")  # poisons row 2 (rowwise) or the whole tensor (tensorwise)
    for scheme in (lowp.TensorScaling(), lowp.AxisScaling()):
        a = lowp_torch.quantize(x, scheme)
        b = lowp_torch.quantize(torch.randn(n, k, generator=gen), scheme)
        y = _triton_decode.skinny_scaled_mm(a, b, out_dtype=torch.float32)
        poisoned = torch.isnan(y).all(dim=1)
        expected = [True] * 4 if isinstance(scheme, lowp.TensorScaling) else [False, False, True, False]
        assert poisoned.tolist() == expected, poisoned
    print('"decode ok"')  # the JSON line _run_interpreted reads
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_skinny_gemm_within_the_gemm_bound_under_the_interpreter():
    assert _run_interpreted(_SCRIPT, timeout=600) == "decode ok"


def test_skinny_gemm_refuses_what_it_does_not_take():
    import torch

    import lowp
    import lowp_torch

    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    from lowp_torch import _triton_decode

    w = lowp_torch.quantize(torch.randn(32, 64), lowp.TensorScaling())
    big = lowp_torch.quantize(torch.randn(_triton_decode.MAX_M + 1, 64), lowp.TensorScaling())
    with pytest.raises(ValueError, match=f"M={_triton_decode.MAX_M + 1}"):
        _triton_decode.skinny_scaled_mm(big, w)
    mx = lowp_torch.quantize(torch.randn(2, 64), lowp.MXScaling("float8_e4m3fn"))
    with pytest.raises(ValueError, match="tensorwise or rowwise"):
        _triton_decode.skinny_scaled_mm(mx, w)
    e5m2 = lowp_torch.quantize(torch.randn(2, 64), lowp.TensorScaling("float8_e5m2"))
    with pytest.raises(ValueError, match="float8_e5m2"):
        _triton_decode.skinny_scaled_mm(e5m2, w)
