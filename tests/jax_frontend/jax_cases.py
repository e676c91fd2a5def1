"""Samples for lowp_jax's exact arithmetic (the divide and the narrow multiply of
`lowp_jax._exact`), shared by test_jax_exact.py (CPU, pytest) and gpu_conformance.py
(whatever device jax sees). The quantize/dequantize cases and their byte comparison
live in lowp_apps.conformance, shared with every other backend.
"""

import numpy as np


def ftz(x: np.ndarray) -> np.ndarray:
    """float32 subnormals replaced by the zero of their sign (spec §0.2), in NumPy."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return np.where((b & 0x7F800000) == 0, b & 0x80000000, b).astype(np.uint32).view(np.float32)


def random_f32(rng, n) -> np.ndarray:
    """Random float32 patterns: every exponent, subnormals, Inf and NaN included."""
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def divide_pairs(rng, n):
    """n (a, b) pairs for the exact divide: random patterns, quotients within a few ulps of
    2**-126, 2**-127 and FLT_MAX (flush, subnormal rounding, overflow), significands equal
    or adjacent (the Ma < Mb doubling), and the formulas' numerators over random b."""
    a, b = random_f32(rng, n), random_f32(rng, n)
    k = n // 8
    for j, target in enumerate((2.0**-126, 2.0**-127, float(np.finfo(np.float32).max))):
        sl = slice(j * k, (j + 1) * k)
        bb = np.abs(ftz(b[sl]))
        bb = np.where((bb == 0) | ~np.isfinite(bb), np.float32(1.5), bb) * np.float32(2.0**-60)
        with np.errstate(all="ignore"):
            aa = (bb.astype(np.float64) * target).astype(np.float32)
        shift = rng.integers(-4, 5, k).astype(np.int64)
        aa = (
            (aa.view(np.uint32).astype(np.int64) + shift)
            .clip(0, 0x7F7FFFFF)
            .astype(np.uint32)
            .view(np.float32)
        )
        a[sl], b[sl] = aa, bb
    sl = slice(3 * k, 4 * k)
    b[sl] = np.abs(ftz(b[sl]))
    near = b[sl].view(np.uint32).astype(np.int64) + rng.integers(-2, 3, k)
    a[sl] = near.clip(0x00800000, 0x7F7FFFFF).astype(np.uint32).view(np.float32)
    sl = slice(4 * k, 5 * k)
    a[sl] = rng.choice(np.float32([448, 57344, 7.5, 28, 6, 2688, 1]), k)
    return a, b


def reference_divide(a, b) -> np.ndarray:
    with np.errstate(all="ignore"):
        return ftz(np.divide(ftz(a), ftz(b), dtype=np.float32))


def count_bit_differences(got, want) -> int:
    """Elements whose bits differ, NaNs of any payload counting as equal."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    return int((~same).sum())
