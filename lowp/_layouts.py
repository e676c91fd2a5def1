"""Byte layouts (spec §5): float4 packing and the cuBLAS block-scaled scale layout."""

import math

import numpy as np

SCALE_LAYOUTS = ("plain", "cublas_blocked")


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes a byte along the last axis: element 2j in bits 3..0, 2j+1 in 7..4."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"pack_fp4 takes uint8 codes, got dtype {codes.dtype}")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"float4 packing needs an even last dim, got shape {codes.shape}")
    if codes.size and codes.max() > 0x0F:
        raise ValueError(f"pack_fp4: {int(codes.max())} is not a 4-bit code (0..15)")
    return pack_checked_fp4(codes)


def pack_checked_fp4(codes: np.ndarray) -> np.ndarray:
    """`pack_fp4` of uint8 codes already known to be 4-bit, with an even last dim (the
    quantizer's own): each pair read as one little-endian uint16 w (element 2j in the
    low byte), whose low byte after w | (w >> 4) is the packed byte; two passes over
    half as many items instead of two strided slices."""
    pairs = np.ascontiguousarray(codes).view("<u2")
    return (pairs | (pairs >> np.uint16(4))).astype(np.uint8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Inverse of `pack_fp4`: one 4-bit code a byte, last axis doubled."""
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:  # a wider int would unpack to nibbles above 15
        raise TypeError(f"unpack_fp4 takes uint8 packed codes, got dtype {packed.dtype}")
    if packed.ndim == 0:
        raise ValueError("unpack_fp4 takes packed codes of rank >= 1, got a 0-d array")
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & np.uint8(0x0F)
    out[..., 1::2] = packed >> np.uint8(4)
    return out


def cublas_blocked_shape(rows: int, cols: int) -> tuple[int, int]:
    """Shape of the blocked layout for a `rows x cols` scale matrix: padded to 128 x 4."""
    return 128 * math.ceil(rows / 128), 4 * math.ceil(cols / 4)


def to_cublas_blocked(scale: np.ndarray) -> np.ndarray:
    """A 2-D scale matrix (rows x K/block) in the layout cuBLAS block-scaled GEMMs read.

    Zero-padded to rows % 128 == 0 and cols % 4 == 0; each 128 x 4 tile is 512
    contiguous bytes, tiles row-major, and inside a tile element (r, c) sits at
    `(r % 32) * 16 + (r % 128 // 32) * 4 + c % 4`. Returned as the padded 2-D array.
    """
    if scale.ndim != 2:
        raise ValueError(f"to_cublas_blocked takes a 2-D scale matrix, got shape {scale.shape}")
    rows, cols = scale.shape
    padded_rows, padded_cols = cublas_blocked_shape(rows, cols)
    padded = np.zeros((padded_rows, padded_cols), dtype=scale.dtype)
    padded[:rows, :cols] = scale
    # r = 128*tile_r + 32*r1 + r0, c = 4*tile_c + c0  ->  (tile_r, tile_c, r0, r1, c0)
    tiles = padded.reshape(padded_rows // 128, 4, 32, padded_cols // 4, 4)
    return np.ascontiguousarray(tiles.transpose(0, 3, 2, 1, 4)).reshape(padded_rows, padded_cols)


def from_cublas_blocked(blocked: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of `to_cublas_blocked`: the `rows x cols` plain scale matrix."""
    expected = cublas_blocked_shape(rows, cols)
    if blocked.shape != expected:
        raise ValueError(
            f"a cublas_blocked scale for a {rows}x{cols} matrix has shape {expected}, "
            f"got {blocked.shape}"
        )
    padded_rows, padded_cols = expected
    tiles = blocked.reshape(padded_rows // 128, padded_cols // 4, 32, 4, 4)
    plain = tiles.transpose(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)
    return np.ascontiguousarray(plain[:rows, :cols])
