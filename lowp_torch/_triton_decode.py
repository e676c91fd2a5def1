"""A skinny fp8 GEMM for decode (M <= 64): the weight's fp8 codes read once, decoded in
registers, products summed in float32. A prototype for issue 22 item 3, not wired into
any default path: the H200 decides first whether it beats `torch._scaled_mm` there.

    y = (a_codes @ b_codes.T) * a_scale[:, None] * b_scale[None, :] + bias

for float8_e4m3fn codes a (M, K) and b (N, K), tensorwise (one scale) or rowwise (one a
row / one b row each) decode scales: the scheme pairs of the float8_tensorwise and
float8_rowwise presets. Each program owns BLOCK_N output columns for all M rows, so
every weight byte is loaded once; the codes are decoded from their bits (exact: every
e4m3 value is a float32), multiplied and summed in float32, and the two scales and the
bias applied to the float32 sum before the one rounding to the output dtype, as
`torch._scaled_mm`'s epilogue does (that rounding is a second launch here, `Tensor.to`).
That order differs from the emulated GEMM (dequantize each element, then a float32
matmul) and from cuBLAS's (its own summation order): spec §7 bounds all of them, and
the tests hold this one to it.

Timed against `torch._scaled_mm` and bf16 on a GPU by `python bench/probes/decode_gemm.py`.
"""

import torch
import triton
import triton.language as tl

from lowp_torch import _qtensor, _storage

MAX_M = 64  # decode and small batches; above it the tensor cores' GEMM wins
_BLOCK_N = 64
_BLOCK_K = 64


@triton.jit
def _decode_e4m3(codes):
    """float32 values of uint8 float8_e4m3fn codes (NaN for 0x7F / 0xFF)."""
    c = codes.to(tl.int32)
    sign = c >> 7
    e = (c >> 3) & 0xF
    m = c & 0x7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # 2^(e-7) (1+m/8)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    v = tl.where((e == 15) & (m == 7), float("nan"), v)
    return tl.where(sign != 0, -v, v)


@triton.jit
def _skinny_kernel(
    a_ptr,
    b_ptr,
    a_scale_ptr,
    b_scale_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    A_ROWWISE: tl.constexpr,
    B_ROWWISE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_CHUNKS: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(K_CHUNKS):  # a constant: one compilation per layer's K
        ks = i * BLOCK_K + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_ptr + rows[:, None] * K + ks[None, :],
            mask=(rows[:, None] < M) & (ks[None, :] < K),
            other=0,
        )
        b = tl.load(
            b_ptr + cols[:, None] * K + ks[None, :],
            mask=(cols[:, None] < N) & (ks[None, :] < K),
            other=0,
        )
        acc += tl.dot(_decode_e4m3(a), tl.trans(_decode_e4m3(b)), input_precision="ieee")
    if A_ROWWISE:
        a_scale = tl.load(a_scale_ptr + rows, mask=rows < M, other=1.0)
    else:
        a_scale = tl.load(a_scale_ptr + rows * 0)
    if B_ROWWISE:
        b_scale = tl.load(b_scale_ptr + cols, mask=cols < N, other=1.0)
    else:
        b_scale = tl.load(b_scale_ptr + cols * 0)
    y = acc * a_scale[:, None] * b_scale[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(
        y_ptr + rows[:, None] * N + cols[None, :],
        y,
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )


def skinny_scaled_mm(
    a: _qtensor.QuantizedTensor,
    b: _qtensor.QuantizedTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`a @ b.T (+ bias)` for float8_e4m3fn a (M, K), M <= MAX_M, and b (N, K), each
    tensorwise or rowwise along K, on the skinny kernel (module docstring).

    Returns a plain (M, N) tensor of out_dtype (float32, bfloat16 or float16). Raises
    ValueError naming what it does not take: another scheme or format, M > MAX_M,
    shapes that do not multiply, a bias that is not (N,).
    """
    m, k = a.shape
    n = b.shape[0]
    if m > MAX_M:
        raise ValueError(f"skinny_scaled_mm: M={m} is above {MAX_M}, the decode sizes it is for")
    if b.dim() != 2 or b.shape[1] != k:
        raise ValueError(
            f"skinny_scaled_mm: a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply as a @ b.T"
        )
    if out_dtype not in _storage.HP_DTYPES:
        raise ValueError(
            f"skinny_scaled_mm: out_dtype must be one of {tuple(_storage.HP_DTYPES)}, got {out_dtype}"
        )
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"skinny_scaled_mm: bias must have shape ({n},), got {tuple(bias.shape)}")
    a_rowwise, a_scale = _scales(a, "a")
    b_rowwise, b_scale = _scales(b, "b")
    # float32 out, rounded by torch: Triton's CPU interpreter rounds a bf16 store toward
    # zero, so an in-kernel cast (one launch fewer, RNE on GPUs) would go untested here.
    y = torch.empty((m, n), dtype=torch.float32, device=a.device)
    if m == 0 or n == 0:
        return y.to(out_dtype)
    _skinny_kernel[(triton.cdiv(n, _BLOCK_N),)](
        _storage.as_bytes(a.codes).contiguous(),
        _storage.as_bytes(b.codes).contiguous(),
        a_scale,
        b_scale,
        y if bias is None else bias.contiguous(),  # unread without a bias
        y,
        m,
        n,
        k,
        A_ROWWISE=a_rowwise,
        B_ROWWISE=b_rowwise,
        HAS_BIAS=bias is not None,
        BLOCK_M=max(16, triton.next_power_of_2(m)),  # tl.dot's smallest tile
        BLOCK_N=_BLOCK_N,
        BLOCK_K=_BLOCK_K,
        K_CHUNKS=triton.cdiv(k, _BLOCK_K),
    )
    return y.to(out_dtype)


def _scales(q, role: str) -> tuple[bool, torch.Tensor]:
    """(rowwise?, the float32 decode scales, one a row or one) of an operand."""
    import lowp

    scheme = _qtensor.scheme_of(q)
    if scheme.fmt != "float8_e4m3fn":
        raise ValueError(f"skinny_scaled_mm: {role} must be float8_e4m3fn, got {scheme.fmt}")
    if isinstance(scheme, lowp.TensorScaling):
        return False, q.scale.reshape(1).contiguous()
    if isinstance(scheme, lowp.AxisScaling) and scheme.axis % 2 == 1 and q.scale_layout == "plain":
        return True, q.scale.reshape(-1).contiguous()
    raise ValueError(
        f"skinny_scaled_mm: {role} must be tensorwise or rowwise along K, got {scheme}"
    )
