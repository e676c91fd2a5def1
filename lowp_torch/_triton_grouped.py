"""Fused Triton casts of the wgrad's grouped operands: scales along the tokens within
each expert (spec §10, kind "tokens"), with the group boundaries read on the device.

The wgrad dw[e] = g[e].T @ x[e] contracts over each expert's tokens, so its operands
g.T (N, T) and x.T (K, T) are scaled along the tokens, one float scale per (feature,
expert) or one MX scale per (feature, block of `block` tokens starting at the
expert's first token). These kernels read the token-major tensor t (T, C) once for
the maxima and once for the codes, and write the codes transposed, (C, T) K-major as
the GEMM reads them, with no host sync: `offs` (E,) int32, the experts' cumulative
end offsets, is read by the kernels. One program takes one expert's run of tokens for
a strip of BLOCK_C features, so no scale is ever shared by two programs (no atomics)
and an expert without tokens just stores its empty groups' scales.

The arithmetic is the dense casts' (`_triton_kernels`: `_float_scale`, `_mx_scale`,
`_encode`), so the bytes are `lowp.extend.quantize_grouped`'s; an expert's short last
MX block reads zeros in its masked lanes, which is the reference's zero padding.
MX scale slots past the last expert's blocks hold the scale of an all-zero block, 0,
and the codes of tokens past the last expert's (padding, where offs ends before T)
are 0, written by `tokens_tail_kernel` rather than by zero-filling every code first.
"""

import torch
import triton
import triton.language as tl

import lowp
from lowp import extend
from lowp_torch import _triton_casts
from lowp_torch import _triton_kernels as K

# Tiles: BLOCK_T tokens x BLOCK_C features. The codes are stored transposed, so a
# strip wide in tokens keeps those stores coalesced; starting points for the H200.
_TILE_FLOAT = (64, 64)
_BLOCK_C_MX = 64


@triton.jit
def _expert_range(offs_ptr, e):
    """(start, end) int64 of expert e's tokens from the end offsets."""
    end = tl.load(offs_ptr + e).to(tl.int64)
    start = tl.load(offs_ptr + e - 1, mask=e > 0, other=0).to(tl.int64)
    return start, end


@triton.jit
def tokens_axis_kernel(
    x_ptr,
    offs_ptr,
    codes_ptr,
    scale_ptr,
    T,
    C,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Float scales (spec §3.1) of x (T, C) along the tokens of expert program_id(1),
    for features program_id(0) * BLOCK_C...: codes (C, T), scales (E, C)."""
    e = tl.program_id(1)
    start, end = _expert_range(offs_ptr, e)
    c = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    amax = tl.zeros([BLOCK_C], tl.int32)
    t0 = start
    while t0 < end:  # not `range`: the interpreter cannot take tensor bounds
        t = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        mask = (t < end)[:, None] & c_mask[None, :]
        absb = K._abs_bits(K._load(x_ptr, t[:, None] * C + c[None, :], mask))
        amax = tl.maximum(amax, tl.max(absb, axis=0))
        t0 += BLOCK_T
    m, scale, poisoned = K._float_scale(amax, FMT_MAX, POW2)
    t0 = start
    while t0 < end:
        t = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        mask = (t < end)[:, None] & c_mask[None, :]
        x = K._load(x_ptr, t[:, None] * C + c[None, :], mask)
        codes = K._encode(x, m[None, :], poisoned[None, :], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
        tl.store(codes_ptr + c[None, :] * T + t[:, None], codes, mask=mask)
        t0 += BLOCK_T
    tl.store(scale_ptr + e.to(tl.int64) * C + c, scale, mask=c_mask)


@triton.jit
def tokens_mx_kernel(
    x_ptr,
    offs_ptr,
    slots_ptr,
    codes_ptr,
    scale_ptr,
    T,
    C,
    capacity,
    MODE: tl.constexpr,
    EMAX: tl.constexpr,
    MAX_MANTISSA: tl.constexpr,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    NATIVE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """MX blocks (spec §3.2) of GROUP tokens from expert program_id(1)'s first token,
    for features program_id(0) * BLOCK_C...: codes (C, T), scale bytes (C, capacity),
    the expert's blocks from slot slots_ptr[e]."""
    e = tl.program_id(1)
    start, end = _expert_range(offs_ptr, e)
    first_slot = tl.load(slots_ptr + e).to(tl.int64)
    c = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    t0 = start
    while t0 < end:
        t = t0 + tl.arange(0, GROUP).to(tl.int64)
        mask = (t < end)[:, None] & c_mask[None, :]
        x = K._load(x_ptr, t[:, None] * C + c[None, :], mask)
        mult, s, poisoned = K._mx_scale(tl.max(K._abs_bits(x), axis=0), MODE, EMAX, MAX_MANTISSA)
        codes = K._encode(x, mult[None, :], poisoned[None, :], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
        tl.store(codes_ptr + c[None, :] * T + t[:, None], codes, mask=mask)
        slot = first_slot + (t0 - start) // GROUP
        tl.store(scale_ptr + c * capacity + slot, s.to(tl.uint8), mask=c_mask)
        t0 += GROUP


@triton.jit
def rows_tokens_amax_kernel(
    x_ptr,
    offs_ptr,
    row_amax_ptr,
    col_amax_ptr,
    C,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """The maxima of both of dy's casts from one read of x (T, C), for expert
    program_id(1)'s tokens and features program_id(0) * BLOCK_C...: |x| bits along the
    tokens (column maxima (E, C), stored) and along the features (row maxima (T,),
    atomic max over the feature strips, zero-initialised)."""
    e = tl.program_id(1)
    start, end = _expert_range(offs_ptr, e)
    c = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    amax = tl.zeros([BLOCK_C], tl.int32)
    t0 = start
    while t0 < end:
        t = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        t_mask = t < end
        absb = K._abs_bits(
            K._load(x_ptr, t[:, None] * C + c[None, :], t_mask[:, None] & c_mask[None, :])
        )
        amax = tl.maximum(amax, tl.max(absb, axis=0))
        tl.atomic_max(row_amax_ptr + t, tl.max(absb, axis=1), mask=t_mask)
        t0 += BLOCK_T
    tl.store(col_amax_ptr + e.to(tl.int64) * C + c, amax, mask=c_mask)


@triton.jit
def rows_tokens_cast_kernel(
    x_ptr,
    offs_ptr,
    row_amax_ptr,
    row_codes_ptr,
    row_scale_ptr,
    col_amax_ptr,
    col_codes_ptr,
    col_scale_ptr,
    T,
    C,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Both of dy's casts from one more read, with `rows_tokens_amax_kernel`'s maxima:
    codes along the features (T, C) with scales (T,), and along the expert's tokens
    (C, T) transposed with scales (E, C); float scales (spec §3.1)."""
    e = tl.program_id(1)
    start, end = _expert_range(offs_ptr, e)
    c = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    col_amax = tl.load(col_amax_ptr + e.to(tl.int64) * C + c, mask=c_mask, other=0)
    m_col, col_scale, col_poisoned = K._float_scale(col_amax, FMT_MAX, POW2)
    t0 = start
    while t0 < end:
        t = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        t_mask = t < end
        mask = t_mask[:, None] & c_mask[None, :]
        x = K._load(x_ptr, t[:, None] * C + c[None, :], mask)
        row_amax = tl.load(row_amax_ptr + t, mask=t_mask, other=0)
        m_row, row_scale, row_poisoned = K._float_scale(row_amax, FMT_MAX, POW2)
        codes = K._encode(
            x, m_row[:, None], row_poisoned[:, None], FMT_MAX, EBITS, MBITS, BIAS, NATIVE
        )
        tl.store(row_codes_ptr + t[:, None] * C + c[None, :], codes, mask=mask)
        tl.store(row_scale_ptr + t, row_scale, mask=t_mask & (tl.program_id(0) == 0))
        codes = K._encode(
            x, m_col[None, :], col_poisoned[None, :], FMT_MAX, EBITS, MBITS, BIAS, NATIVE
        )
        tl.store(col_codes_ptr + c[None, :] * T + t[:, None], codes, mask=mask)
        t0 += BLOCK_T
    tl.store(col_scale_ptr + e.to(tl.int64) * C + c, col_scale, mask=c_mask)


@triton.jit
def tokens_tail_kernel(
    codes_ptr,
    offs_ptr,
    experts,
    T,
    C,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Zero codes (C, T) for the tokens past the last expert's, offs[E - 1] <= t < T,
    features program_id(0) * BLOCK_C...: padding no group holds and no GEMM reads,
    whose bytes stay defined. No program has work when the experts end at T."""
    c = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = c < C
    t0 = tl.load(offs_ptr + experts - 1).to(tl.int64)
    while t0 < T:
        t = t0 + tl.arange(0, BLOCK_T).to(tl.int64)
        mask = (t < T)[:, None] & c_mask[None, :]
        zeros = tl.zeros([BLOCK_T, BLOCK_C], tl.uint8)
        tl.store(codes_ptr + c[None, :] * T + t[:, None], zeros, mask=mask)
        t0 += BLOCK_T


def _codes(tokens: int, cols: int, offs: torch.Tensor, device) -> torch.Tensor:
    """The codes buffer (C, T), its columns past the last expert's tokens zeroed on the
    device (`tokens_tail_kernel`: no host read of offs, and no fill of the whole
    buffer the casts then overwrite)."""
    experts = offs.shape[0]
    if not experts:
        return torch.zeros((cols, tokens), dtype=torch.uint8, device=device)
    codes = torch.empty((cols, tokens), dtype=torch.uint8, device=device)
    block_t, block_c = _TILE_FLOAT
    if cols and tokens:
        tokens_tail_kernel[(triton.cdiv(cols, block_c),)](
            codes, offs, experts, tokens, cols, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=4
        )
    return codes


def launch_tokens(x: torch.Tensor, offs: torch.Tensor, scheme) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 codes (C, T), scales) of x (T, C) scaled along each expert's tokens:
    float32 (E, C) for AxisScaling (the reference's (C, E), transposed), e8m0 bytes
    (C, capacity) for MXScaling (`extend.token_capacity`). x contiguous, offs (E,) int32
    on x's device; the caller has checked the scheme (`_cast_kernels.scheme_problem`)."""
    tokens, cols = x.shape
    experts = offs.shape[0]
    fmt = extend.element_format(scheme.fmt)
    element = _triton_casts._element_args(fmt, x)
    with _triton_casts._on_device(x):
        # the columns of tokens past offs[-1] (padding) belong to no group, and no GEMM
        # reads them, but their bytes stay defined: zeros
        codes = _codes(tokens, cols, offs, x.device)
        if isinstance(scheme, lowp.AxisScaling):
            scale = torch.empty((experts, cols), dtype=torch.float32, device=x.device)
            block_t, block_c = _TILE_FLOAT
            if cols and experts:
                tokens_axis_kernel[(triton.cdiv(cols, block_c), experts)](
                    x,
                    offs,
                    codes,
                    scale,
                    tokens,
                    cols,
                    POW2=scheme.pow2,
                    BLOCK_T=block_t,
                    BLOCK_C=block_c,
                    num_warps=4,
                    **element,
                )
            return codes, scale
        if not isinstance(scheme, lowp.MXScaling):
            raise TypeError(f"no grouped Triton cast for {scheme!r}")
        block = scheme.block
        capacity = extend.token_capacity(tokens, experts, block)
        scale = torch.zeros((cols, capacity), dtype=torch.uint8, device=x.device)
        sizes = torch.diff(offs.to(torch.int64), prepend=offs.new_zeros(1, dtype=torch.int64))
        blocks = (sizes + (block - 1)) // block
        slots = torch.cumsum(blocks, 0) - blocks
        if cols and experts:
            tokens_mx_kernel[(triton.cdiv(cols, _BLOCK_C_MX), experts)](
                x,
                offs,
                slots,
                codes,
                scale,
                tokens,
                cols,
                capacity,
                MODE=_triton_casts._MX_MODES[scheme.mode],
                EMAX=fmt.emax,
                MAX_MANTISSA=fmt.max_mantissa,
                GROUP=block,
                BLOCK_C=_BLOCK_C_MX,
                num_warps=4,
                **element,
            )
        return codes, scale


def launch_rows_and_tokens(x: torch.Tensor, offs: torch.Tensor, scheme):
    """Both casts of the backward's dy (T, C) for AxisScaling from two reads of it
    instead of three: ((uint8 codes (T, C), float32 scales (T,)) along the features,
    the dgrad's rows; (uint8 codes (C, T), float32 scales (E, C)) along each expert's
    tokens, the wgrad's, as `launch_tokens`). x contiguous; offs (E,) int32 on x's
    device ending at T (every row in some expert: the eager path has checked it), E >= 1.

    Bytes an element (bf16): 2 (maxima) + 2 + 1 + 1 (both casts), against 2 + 1 for
    the rows cast and 2 + 2 + 1 for the tokens cast apart."""
    tokens, cols = x.shape
    experts = offs.shape[0]
    fmt = extend.element_format(scheme.fmt)
    element = _triton_casts._element_args(fmt, x)
    device = x.device
    row_codes = torch.empty((tokens, cols), dtype=torch.uint8, device=device)
    row_scale = torch.empty(tokens, dtype=torch.float32, device=device)
    row_amax = torch.zeros(tokens, dtype=torch.int32, device=device)
    col_amax = torch.empty((experts, cols), dtype=torch.int32, device=device)
    col_scale = torch.empty((experts, cols), dtype=torch.float32, device=device)
    block_t, block_c = _TILE_FLOAT
    with _triton_casts._on_device(x):
        col_codes = _codes(tokens, cols, offs, device)
        if cols and experts:
            grid = (triton.cdiv(cols, block_c), experts)
            tile = {"BLOCK_T": block_t, "BLOCK_C": block_c, "num_warps": 4}
            rows_tokens_amax_kernel[grid](x, offs, row_amax, col_amax, cols, **tile)
            rows_tokens_cast_kernel[grid](
                x,
                offs,
                row_amax,
                row_codes,
                row_scale,
                col_amax,
                col_codes,
                col_scale,
                tokens,
                cols,
                POW2=scheme.pow2,
                **tile,
                **element,
            )
    return (row_codes, row_scale), (col_codes, col_scale)
