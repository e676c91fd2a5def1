"""A transposed 2-D tensor of one-byte elements (fp8 codes) made contiguous, in Triton.

The GEMMs feed `torch._scaled_mm` operands that can exist as transposed views: codes
kept for the backward where `quantize_both` did not write them transposed (tensorwise
codes made on the torch ops, FSDP2's gathered tensorwise weights, square-tile
blockwise codes), and transposed codes a caller passes. The GEMM takes row-major A and column-major B, so each such view is
copied once. Measured on the H200
(torch 2.11): `.contiguous()` of a transposed 16384 x 8192 fp8 tensor runs PyTorch's
generic strided-copy kernel, about 1 ms, half the time of the fp8 GEMM it feeds. This
kernel copies tiles: each program loads a (BLOCK, BLOCK) tile along the source's
contiguous axis and stores it along the destination's, with Triton's layout
conversion through shared memory in between, so both sides are coalesced.

A copy: the bytes are the view's, whatever they encode. `_cast_kernels.contiguous`
decides when this runs.
"""

import contextlib

import torch
import triton
import triton.language as tl

_BLOCK = 64  # a 64 x 64 byte tile: 4 KiB of shared memory per program


@triton.jit
def _transpose_kernel(src, dst, rows, cols, BLOCK: tl.constexpr):
    """dst (rows, cols) row-major = the (rows, cols) view of src, which is column-major."""
    # Columns on grid axis 0 (up to 2**31 - 1 programs): they are the tokens M of the
    # wgrad operands, which can exceed axis 1's 65535 tiles; rows are K or N.
    c = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    r = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = (r[:, None] < rows) & (c[None, :] < cols)
    tile = tl.load(src + r[:, None] + c[None, :] * rows, mask=inside)
    tl.store(dst + r[:, None] * cols + c[None, :], tile, mask=inside)


def contiguous_transposed(t: torch.Tensor) -> torch.Tensor:
    """`t.contiguous()` for a 2-D column-major `t` (strides (1, rows)) of one-byte
    elements, in t's dtype."""
    rows, cols = t.shape
    if t.element_size() != 1 or t.stride() != (1, rows):
        raise ValueError(
            f"contiguous_transposed takes a column-major 2-D tensor of one-byte elements, "
            f"got {t.dtype} with shape {tuple(t.shape)} and strides {t.stride()}"
        )
    src = t.view(torch.uint8)
    out = torch.empty((rows, cols), dtype=torch.uint8, device=t.device)
    if triton.cdiv(rows, _BLOCK) > 65535:
        raise ValueError(
            f"contiguous_transposed: {rows} rows is more than CUDA's 65535 x {_BLOCK} on grid "
            "axis 1"
        )
    grid = (triton.cdiv(cols, _BLOCK), triton.cdiv(rows, _BLOCK))
    # Triton launches on the current device; the interpreter takes CPU tensors.
    with torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext():
        _transpose_kernel[grid](src, out, rows, cols, BLOCK=_BLOCK, num_warps=4)
    return out.view(t.dtype)
