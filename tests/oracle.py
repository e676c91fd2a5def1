"""A slow, independent oracle for the reference numerics, for tests only.

It shares no code with lowp's numerics: groups are walked with explicit index loops,
element rounding is ml_dtypes' cast, MX exponents come from exact rational arithmetic
(fractions), and stochastic rounding from exact fractions. Where it agrees with
lowp.quantize byte for byte, two derivations of spec §3–§4 agree.
"""

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np

FMT_DTYPES = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
}
FMT_MAX = {name: float(ml_dtypes.finfo(dt).max) for name, dt in FMT_DTYPES.items()}
FMT_EMAX = {name: math.floor(math.log2(m)) for name, m in FMT_MAX.items()}
F32 = np.float32


def ftz_scalar(v: np.float32) -> np.float32:
    if np.isnan(v):
        return F32(v)
    return F32(math.copysign(0.0, v)) if abs(float(v)) < 2.0**-126 else F32(v)


def cast_code(v: float, fmt: str) -> int:
    """ml_dtypes' RNE cast of an in-range float32 to a code (one per byte)."""
    return int(np.array([v], F32).astype(FMT_DTYPES[fmt]).view(np.uint8)[0])


def groups(shape, scheme):
    """Yield (scale index, list of element indices) for each group, by plain loops."""
    kind = type(scheme).__name__
    rank = len(shape)
    if kind == "TensorScaling":
        yield (), list(itertools.product(*map(range, shape)))
        return
    if kind == "AxisScaling":
        ax = scheme.axis % rank
        others = [range(n) if i != ax else range(1) for i, n in enumerate(shape)]
        for idx in itertools.product(*others):
            yield idx, [idx[:ax] + (j,) + idx[ax + 1 :] for j in range(shape[ax])]
        return
    if kind == "BlockScaling":
        b0, b1 = scheme.block
        lead = list(itertools.product(*map(range, shape[:-2])))
        for head in lead:
            for tr in range(math.ceil(shape[-2] / b0)):
                for tc in range(math.ceil(shape[-1] / b1)):
                    members = [
                        head + (r, c)
                        for r in range(tr * b0, min((tr + 1) * b0, shape[-2]))
                        for c in range(tc * b1, min((tc + 1) * b1, shape[-1]))
                    ]
                    yield head + (tr, tc), members
        return
    if kind in ("MXScaling", "NVFP4Scaling"):
        ax = scheme.axis % rank
        blocks = list(shape)
        blocks[ax] = shape[ax] // scheme.block
        for idx in itertools.product(*map(range, blocks)):
            start = idx[ax] * scheme.block
            yield idx, [idx[:ax] + (j,) + idx[ax + 1 :] for j in range(start, start + scheme.block)]
        return
    raise TypeError(kind)


def mx_scale_byte(amax: float, fmt: str, mode: str) -> int:
    """e8m0 byte from the real-number definitions: floor/ceil of log2(amax), minus emax;
    rceil = the smallest k with max * 2**k >= amax (exact rationals)."""
    if amax == 0:
        return 0
    a = Fraction(amax)
    if mode == "floor":
        k = math.frexp(amax)[1] - 1 - FMT_EMAX[fmt]
    elif mode == "ceil":
        e = math.frexp(amax)[1] - 1
        k = e + (a != Fraction(2) ** e) - FMT_EMAX[fmt]
    else:
        k = -200
        while Fraction(FMT_MAX[fmt]) * Fraction(2) ** k < a:
            k += 1
    return max(k + 127, 0)


def quantize_nearest(x: np.ndarray, scheme):
    """(codes one per byte, scale array, global scale) for round-to-nearest."""
    x = x.astype(F32)
    shape = x.shape
    kind = type(scheme).__name__
    fmt = scheme.fmt
    top = FMT_MAX[fmt]
    codes = np.zeros(shape, np.uint8)
    scale_shape = scheme.scale_shape(shape)
    scale = np.zeros(
        scale_shape, F32 if kind in ("TensorScaling", "AxisScaling", "BlockScaling") else np.uint8
    )
    flushed = np.vectorize(ftz_scalar, otypes=[F32])(x) if x.size else x
    global_scale = None
    if kind == "NVFP4Scaling":
        finite = np.isfinite(flushed).all()
        big_a = float(np.max(np.abs(flushed))) if flushed.size and finite else 0.0
        if scheme.global_scale:
            s_enc = F32(1) if big_a == 0 else min(F32(F32(2688) / F32(big_a)), F32(3.4028235e38))
            s_dec = ftz_scalar(F32(F32(1) / s_enc))
            global_scale = F32(s_dec) if finite else F32(np.nan)
        else:
            s_enc = s_dec = F32(1)
    for sidx, members in groups(shape, scheme):
        vals = [flushed[i] for i in members]
        if not all(np.isfinite(v) for v in vals) or (
            kind == "NVFP4Scaling" and global_scale is not None and np.isnan(global_scale)
        ):
            scale[sidx] = np.nan if scale.dtype == F32 else (0xFF if kind == "MXScaling" else 0x7F)
            continue
        amax = max((abs(float(v)) for v in vals), default=0.0)
        if kind in ("TensorScaling", "AxisScaling", "BlockScaling"):
            m = F32(F32(top) / max(F32(amax), F32(1e-12)))
            if scheme.pow2:
                m = F32(2.0 ** math.floor(math.log2(float(m))))  # exact for a float32 m
            scale[sidx] = F32(1) / m
            for i in members:
                v = float(np.clip(ftz_scalar(F32(flushed[i] * m)), -top, top))
                codes[i] = cast_code(v, fmt)
        elif kind == "MXScaling":
            s = mx_scale_byte(amax, fmt, scheme.mode)
            scale[sidx] = s
            for i in members:
                v = ftz_scalar(F32(float(flushed[i]) * 2.0 ** (127 - s)))
                codes[i] = cast_code(float(np.clip(v, -top, top)), fmt)
        else:  # NVFP4
            k = F32(s_enc * F32(F32(1) / F32(6)))
            sb_val = min(ftz_scalar(F32(F32(amax) * k)), F32(448))
            sb = cast_code(float(sb_val), "float8_e4m3fn")
            scale[sidx] = sb
            p = ftz_scalar(F32(F32(np.uint8(sb).view(ml_dtypes.float8_e4m3fn)) * s_dec))
            inv = F32(3.4028235e38) if p == 0 else min(F32(F32(1) / p), F32(3.4028235e38))
            with np.errstate(over="ignore"):
                for i in members:
                    v = float(np.clip(F32(flushed[i] * inv), -6, 6))
                    codes[i] = cast_code(float(ftz_scalar(F32(v))), fmt)
    return codes, scale, global_scale


def hash_bits(seed: int, index: int, offset: int = 0) -> int:
    """spec §4's hash with Python ints."""
    mask = 0xFFFFFFFF
    x = (((index + offset) & mask) * 0x9E3779B9 + (seed & mask)) & mask
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & mask
    x ^= x >> 15
    x = (x * 0x735A2D97) & mask
    x ^= x >> 15
    return x


def stochastic_value(v: float, fmt: str, r: int) -> float:
    """spec §4 with exact rationals: round |v| down or up on the format's grid."""
    mbits = {
        "float8_e4m3fn": 3,
        "float8_e5m2": 2,
        "float6_e2m3fn": 3,
        "float6_e3m2fn": 2,
        "float4_e2m1fn": 1,
    }[fmt]
    bias = {
        "float8_e4m3fn": 7,
        "float8_e5m2": 15,
        "float6_e2m3fn": 1,
        "float6_e3m2fn": 3,
        "float4_e2m1fn": 1,
    }[fmt]
    a = Fraction(abs(v))
    e = 1 - bias if a == 0 else max(math.frexp(abs(v))[1] - 1, 1 - bias)
    t = a * Fraction(2) ** (mbits - e)
    n = math.floor(t)
    f = t - n
    up = math.floor(f * 2**24) + (r >> 8) >= 2**24
    q = min(Fraction(n + up) * Fraction(2) ** (e - mbits), Fraction(FMT_MAX[fmt]))
    return math.copysign(float(q), v)
