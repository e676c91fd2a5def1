"""Byte layouts (spec §5): float4 packing and the cuBLAS block-scaled scale layout,
as `lowp._layouts` but on JAX arrays (jit-able; shapes are static)."""

import jax.numpy as jnp
import numpy as np

from lowp import extend


def pack_fp4(codes: jnp.ndarray) -> jnp.ndarray:
    """Two 4-bit codes a byte along the last axis: element 2j in bits 3..0, 2j+1 in 7..4."""
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"float4 packing needs an even last dim, got shape {codes.shape}")
    pairs = codes.reshape(codes.shape[:-1] + (codes.shape[-1] // 2, 2))
    return (pairs[..., 0] & np.uint8(0x0F)) | (pairs[..., 1] << np.uint8(4))


def unpack_fp4(packed: jnp.ndarray) -> jnp.ndarray:
    """Inverse of `pack_fp4`: one 4-bit code a byte, last axis doubled."""
    pairs = jnp.stack([packed & np.uint8(0x0F), packed >> np.uint8(4)], axis=-1)
    return pairs.reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def to_cublas_blocked(scale: jnp.ndarray) -> jnp.ndarray:
    """A 2-D scale matrix (rows x K/block) in the layout cuBLAS block-scaled GEMMs read
    (zero-padded to 128 x 4 tiles of 512 contiguous bytes; see `lowp.to_cublas_blocked`)."""
    if scale.ndim != 2:
        raise ValueError(f"to_cublas_blocked takes a 2-D scale matrix, got shape {scale.shape}")
    rows, cols = scale.shape
    padded_rows, padded_cols = extend.cublas_blocked_shape(rows, cols)
    padded = jnp.pad(scale, ((0, padded_rows - rows), (0, padded_cols - cols)))
    tiles = padded.reshape(padded_rows // 128, 4, 32, padded_cols // 4, 4)
    return tiles.transpose(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)


def from_cublas_blocked(blocked: jnp.ndarray, rows: int, cols: int) -> jnp.ndarray:
    """Inverse of `to_cublas_blocked`: the `rows x cols` plain scale matrix."""
    expected = extend.cublas_blocked_shape(rows, cols)
    if blocked.shape != expected:
        raise ValueError(
            f"a cublas_blocked scale for a {rows}x{cols} matrix has shape {expected}, "
            f"got {blocked.shape}"
        )
    padded_rows, padded_cols = expected
    tiles = blocked.reshape(padded_rows // 128, padded_cols // 4, 32, 4, 4)
    return tiles.transpose(0, 3, 2, 1, 4).reshape(padded_rows, padded_cols)[:rows, :cols]
