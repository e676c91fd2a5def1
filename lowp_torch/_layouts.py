"""Byte layouts (spec §5) in torch: float4 packing and the cuBLAS block-scaled layout.

Ports of `lowp._layouts`, on uint8 tensors; the callers relabel the bytes with
torch's storage dtypes.
"""

import torch
import torch.nn.functional as F

from lowp import extend


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """uint8, one code a byte -> two a byte along the last axis: element 2j in bits 3..0."""
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"float4 packing needs an even last dim, got shape {tuple(codes.shape)}")
    low = codes[..., 0::2] & 0x0F
    high = codes[..., 1::2] & 0x0F
    return low | (high << 4)


def pack_fp4_on_host(codes: torch.Tensor, scratch, out: torch.Tensor) -> None:
    """`pack_fp4` of contiguous uint8 codes into `out`, on the CPU in eager mode: each
    pair read as one little-endian int16 w (element 2j in the low byte), whose low byte
    after w | (w >> 4) is the packed byte; three passes over half as many items, in a
    reused `scratch` buffer, instead of two strided slices and their temporaries."""
    # flat, as the last dim is even: a pair never straddles two rows
    pairs = codes.reshape(-1).view(torch.int16)  # codes < 16: w < 2**12, no sign shifts in
    packed = scratch.take("packed", torch.int16, tuple(pairs.shape))
    torch.bitwise_right_shift(pairs, scratch.constant(4, torch.int16), out=packed)
    packed.bitwise_or_(pairs)
    out.copy_(packed.view(out.shape))  # int16 -> uint8 keeps the low byte


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_fp4`: uint8, one 4-bit code a byte, last axis doubled."""
    pairs = torch.stack([packed & 0x0F, packed >> 4], dim=-1)
    return pairs.reshape(tuple(packed.shape[:-1]) + (packed.shape[-1] * 2,))


def to_cublas_blocked(scale: torch.Tensor) -> torch.Tensor:
    """A 2-D uint8 scale matrix (rows x K/block) in the layout cuBLAS block-scaled GEMMs read.

    Zero-padded to rows % 128 == 0 and cols % 4 == 0; each 128 x 4 tile is 512
    contiguous bytes, tiles row-major, and inside a tile (r, c) sits at
    `(r % 32) * 16 + (r % 128 // 32) * 4 + c % 4` (torchao `to_blocked`).
    """
    if scale.ndim != 2:
        raise ValueError(
            f"to_cublas_blocked takes a 2-D scale matrix, got shape {tuple(scale.shape)}"
        )
    rows, cols = scale.shape
    padded_rows, padded_cols = extend.cublas_blocked_shape(rows, cols)
    padded = F.pad(scale, (0, padded_cols - cols, 0, padded_rows - rows))
    # r = 128*tile_r + 32*r1 + r0, c = 4*tile_c + c0  ->  (tile_r, tile_c, r0, r1, c0)
    tiles = padded.reshape(padded_rows // 128, 4, 32, padded_cols // 4, 4)
    return tiles.permute(0, 3, 2, 1, 4).contiguous().reshape(padded_rows, padded_cols)


def from_cublas_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of `to_cublas_blocked`: the `rows x cols` plain uint8 scale matrix."""
    expected = extend.cublas_blocked_shape(rows, cols)
    if tuple(blocked.shape) != expected:
        raise ValueError(
            f"a cublas_blocked scale for a {rows}x{cols} matrix has shape {expected}, "
            f"got {tuple(blocked.shape)}"
        )
    padded_rows, padded_cols = expected
    tiles = blocked.reshape(padded_rows // 128, padded_cols // 4, 32, 4, 4)
    plain = tiles.permute(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)
    return plain[:rows, :cols].contiguous()
