"""Shared by the dot and flax tests: operands, the float64 reference of spec §7, SQNR."""

import jax
import ml_dtypes
import numpy as np

import lowp
import lowp_jax

PRESETS = lowp.InferenceConfig.names()
# Spec §8 floors for a quantized layer's output against high precision.
LAYER_SQNR_DB = {name: (12.0 if name in ("mxfp4", "nvfp4") else 25.0) for name in PRESETS}
GEMM_SQNR_DB = 40.0  # spec §7: every path against the product of its dequantized operands
K, N = 256, 48  # K divides every preset's blocks (16, 32, 128); N is no multiple of 32
SHAPES = {2: (8, K), 3: (2, 4, K), 4: (2, 2, 2, K)}


def impls() -> tuple[str, ...]:
    """The dot_general branches this backend can run (scaled_matmul only on Blackwell)."""
    found = ("auto", "emulated", "dequantize", "fp8")
    return found + (("scaled_matmul",) if lowp_jax.scaled_matmul_problem() is None else ())


def runs(preset: str, impl: str) -> bool:
    """Whether `impl` can take the two operands of `preset` (auto and emulation take all)."""
    config = lowp.InferenceConfig.from_name(preset)
    a, w = config.activation, config.weight
    if impl == "fp8":
        return all(isinstance(s, (lowp.TensorScaling, lowp.AxisScaling)) for s in (a, w) if s) and (
            a is not None
        )
    if impl == "scaled_matmul":
        return preset in ("mxfp8", "mxfp4", "nvfp4")
    return True


def operands(shape, seed=0, hp_dtype=np.float32):
    """An activation of `shape` (last dim K) and an (N, K) weight, float32 or bfloat16,
    with a spread of magnitudes across rows so that per-row scales matter."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x *= np.exp2(rng.integers(-3, 4, size=shape[:-1] + (1,))).astype(np.float32)
    w = (rng.standard_normal((N, shape[-1])) / np.sqrt(shape[-1])).astype(np.float32)
    return jax.numpy.asarray(x.astype(hp_dtype)), jax.numpy.asarray(w.astype(hp_dtype))


def dequantized(x, scheme) -> np.ndarray:
    """What a dot sees of `x` quantized with `scheme` (None: x itself), in float64."""
    if scheme is None:
        return np.asarray(x, np.float64)
    return np.asarray(lowp_jax.dequantize(lowp_jax.quantize(x, scheme), "float32"), np.float64)


def exact_product(a64: np.ndarray, b64: np.ndarray) -> np.ndarray:
    """a (..., K) @ b (N, K).T in float64."""
    return np.einsum("...k,nk->...n", a64, b64)


def sqnr_db(y, ref) -> float:
    """20 log10(||ref|| / ||ref - y||), in float64 (inf when equal)."""
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    err = np.linalg.norm(ref - y)
    return float("inf") if err == 0 else float(20 * np.log10(np.linalg.norm(ref) / err))


def ulp(values: np.ndarray, out_dtype) -> np.ndarray:
    """The spacing of `out_dtype` at each value (normal range)."""
    nmant = ml_dtypes.finfo(out_dtype).nmant
    tiny = float(ml_dtypes.finfo(out_dtype).smallest_normal)
    return np.exp2(np.floor(np.log2(np.maximum(np.abs(values), tiny))) - nmant)


def gemm_bound(a64, b64, y_exact, out_dtype) -> np.ndarray:
    """Spec §7's elementwise bound without fast accumulation:
    ulp_out(y_exact) + K 2^-23 sum_k |a_ik b_kj|."""
    k = a64.shape[-1]
    return ulp(y_exact, out_dtype) + k * 2.0**-23 * exact_product(np.abs(a64), np.abs(b64))
