"""The arithmetic steps the producer scale rules share: roundings, group amax, e4m3 codes.

Each rule (`_rules_*.py`) is written as its producer's code runs, one rounding at a time;
these are the steps they have in common. Values travel as float32 numpy arrays.
"""

import ml_dtypes
import numpy as np

from lowp import _bits, _groups

HP = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
FP8_MAX, FP4_MAX = np.float32(448), np.float32(6)


def round_to(values: np.ndarray, hp_name: str) -> np.ndarray:
    """float32 values rounded once to the hp dtype, back as float32.

    A float32 operation then this rounding is the one rounding torch does for a bf16 or
    f16 result: float32 has at least 2p + 2 bits, so the double rounding is innocuous."""
    return values.astype(HP[hp_name]).astype(np.float32)


def group_amax(xf: np.ndarray, scheme) -> np.ndarray:
    """max |x| of each group of float32 `xf`, in the scheme's scale shape (partial edge
    tiles over their elements only)."""
    magnitude = _bits.bits(xf) & np.uint32(0x7FFFFFFF)  # group_max reduces bit patterns
    return _bits.from_bits(_groups.group_max(magnitude, scheme)).astype(np.float32)


def e4m3_codes(values: np.ndarray) -> np.ndarray:
    """float8_e4m3fn bytes of float32 `values`, one round-to-nearest-even (torch's and
    ml_dtypes' `.to(float8_e4m3fn)`: |v| in (448, 464) gives 448, beyond it NaN)."""
    return values.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def pow2_ceil(values: np.ndarray) -> np.ndarray:
    """2**ceil(log2(v)) with log2 rounded to float32 first, as torch's and Triton's
    float32 `log2` then `ceil` compute it: a v a few ulps above 2**k has a float32 log2
    of exactly k (for |k| >= 2), so it gives 2**k, not the exact ceiling's 2**(k+1)."""
    with np.errstate(divide="ignore"):
        log2 = np.log2(values.astype(np.float64)).astype(np.float32)
    return np.exp2(np.ceil(log2)).astype(np.float32)
