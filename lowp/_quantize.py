"""The NumPy reference: `quantize` and `dequantize`, the oracle every backend matches.

Each scale family's algorithm (`scheme.family`: float, MX, NVFP4) is written out in
one branch of `quantize` and one of `dequantize`, in the order spec §3 gives, with float32 operations that each round
once. Group handling lives in `_groups`, the element encoder in `_formats`.
"""

import ml_dtypes
import numpy as np

from lowp import _bits, _formats, _groups, _layouts, _qtensor, _rounding, _schemes

EPS = np.float32(1e-12)  # 0x2B8CBCCC: floor on amax for float scales (spec §3.1)
_E4M3 = _formats.FLOAT8_E4M3FN
_E2M1 = _formats.FLOAT4_E2M1FN
_NUMPY_DTYPES = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
_CANONICAL_NAN_BITS = {"float32": 0x7FC00000, "bfloat16": 0x7FC0, "float16": 0x7E00}


def _hp_input(x, name: str) -> tuple[np.ndarray, str]:
    """float32 view of an accepted input and its dtype name; TypeError for the rest (§0.1)."""
    if isinstance(x, np.generic):  # a numpy scalar is a 0-d array
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"{name}: lowp.quantize takes a numpy array, got {type(x).__name__}; "
            "use lowp_torch / lowp_jax for framework tensors"
        )
    if x.dtype == np.float64:
        raise TypeError(
            f"{name}: float64 input is refused (float64 -> float32 -> float8 rounds twice); "
            "cast to float32 first if that is what you mean"
        )
    for hp_dtype, dtype in _NUMPY_DTYPES.items():
        if x.dtype == dtype:
            return x.astype(np.float32), hp_dtype
    raise TypeError(f"{name}: input dtype {x.dtype} is not float32, bfloat16 or float16")


def _random_for(x: np.ndarray, rounding, random_bits, seed, offset, name) -> np.ndarray | None:
    """The uint32 per element that stochastic rounding consumes, or None for nearest."""
    source = _rounding.random_source(rounding, random_bits, seed, offset == 0, name)
    if source == "none":
        return None
    if source == "seed":
        return _rounding.random_bits(seed, x.shape, offset)
    if not isinstance(random_bits, np.ndarray) or random_bits.dtype != np.uint32:
        raise TypeError(
            f"{name}: random_bits must be a uint32 numpy array, got {random_bits!r:.80}"
        )
    if random_bits.shape != x.shape:
        raise ValueError(
            f"{name}: random_bits has shape {random_bits.shape}, the input {x.shape}; one per element"
        )
    return random_bits


def _check_finite(absb: np.ndarray, name: str) -> None:
    bad = absb >= _bits.INF_BITS
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), absb.shape)
        value = _bits.from_bits(absb.reshape(-1)[int(np.argmax(bad.reshape(-1)))] | 0)
        raise FloatingPointError(
            f"{name}: {int(bad.sum())} non-finite element(s), the first at index "
            f"{tuple(int(i) for i in first)} (|x| = {value}); check_finite=True refuses to quantize"
        )


def _encode_elements(v, fmt, random, poisoned_elements) -> np.ndarray:
    """Clamp to +-max, flush, round to codes; code 0 in poisoned groups."""
    with np.errstate(invalid="ignore"):  # NaN in poisoned groups is overwritten below
        v = _bits.ftz(np.clip(v, -np.float32(fmt.max), np.float32(fmt.max)))
    v = np.where(poisoned_elements, np.float32(0), v)
    codes = _rounding.round_elements(v, fmt, random)
    return np.where(poisoned_elements, np.uint8(0), codes)


def float_scales(
    amax: np.ndarray, fmt: _formats.Format, pow2: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Encode multiplier m and stored decode scale d for float scales (spec §3.1)."""
    m = np.divide(np.float32(fmt.max), np.maximum(amax, EPS), dtype=np.float32)
    if pow2:  # round down to a power of two by clearing the mantissa: exact, no log2
        m = _bits.from_bits(_bits.bits(m) & _bits.EXP_MASK)
    d = np.divide(np.float32(1), m, dtype=np.float32)
    return m, d


def mx_scale_bytes(amax_bits: np.ndarray, fmt: _formats.Format, mode: str) -> np.ndarray:
    """The e8m0 byte of each finite group amax (spec §3.2), from exponent bits only."""
    exponent = _bits.biased_exponent(amax_bits)
    mantissa = (amax_bits & _bits.MANT_MASK).astype(np.int64)
    if mode == "floor":
        up: int | np.ndarray = 0
    elif mode == "ceil":
        up = (mantissa != 0).astype(np.int64)
    elif mode == "rceil":
        up = (mantissa > fmt.max_mantissa).astype(np.int64)
    else:
        raise ValueError(f"unknown MX mode {mode!r}")
    return np.maximum(exponent + up - fmt.emax, 0).astype(np.uint8)


def quantize(
    x: np.ndarray,
    scheme: _schemes.Scheme,
    *,
    rounding: str = "nearest",
    random_bits: np.ndarray | None = None,
    seed: int | None = None,
    offset: int = 0,
    check_finite: bool = False,
    name: str = "input",
) -> _qtensor.QTensor:
    """Quantize `x` with `scheme`; the bit-exact reference of spec §3–§6.

    Args:
      x: float32, bfloat16 (ml_dtypes) or float16 array of any shape the scheme admits.
      scheme: a lowp scheme (`lowp.extend.SCHEME_TYPES`).
      rounding: "nearest" (ties to even) or "stochastic" (spec §4).
      random_bits: uint32 array shaped like `x`, for stochastic rounding.
      seed, offset: instead of random_bits, draw them with `lowp.random_bits`.
      check_finite: raise FloatingPointError on NaN/Inf instead of poisoning the group.
      name: how errors refer to `x` (a parameter name, say).

    Returns:
      A QTensor with the plain scale layout.

    >>> import lowp
    >>> q = lowp.quantize(np.array([1.0, -2.0, 448.0], np.float32), lowp.TensorScaling())
    >>> q.codes.tolist(), float(q.scale)
    ([56, 192, 126], 1.0)
    """
    _schemes.check_scheme(scheme)
    xf, hp_dtype = _hp_input(x, name)
    shape = xf.shape
    scheme.check_shape(shape)
    random = _random_for(xf, rounding, random_bits, seed, offset, name)
    xf = _bits.ftz(xf)
    absb = _bits.abs_bits(xf)
    if check_finite:
        _check_finite(absb, name)
    fmt = _formats.element_format(scheme.fmt)
    amax_bits = _groups.group_max(absb, scheme)
    poisoned = amax_bits >= _bits.INF_BITS
    poisoned_elements = _groups.expand(poisoned, scheme, shape)
    amax = _bits.from_bits(np.where(poisoned, np.uint32(0), amax_bits))
    global_scale = None

    if scheme.family == "float":
        m, d = float_scales(amax, fmt, scheme.pow2)  # type: ignore[union-attr]  # float family
        with np.errstate(over="ignore", invalid="ignore"):  # only in poisoned groups
            v = _bits.ftz(np.multiply(xf, _groups.expand(m, scheme, shape), dtype=np.float32))
        codes = _encode_elements(v, fmt, random, poisoned_elements)
        scale = np.where(poisoned, _bits.from_bits(_bits.NAN_F32), d).astype(np.float32)
    elif scheme.family == "mx":
        s = np.where(poisoned, np.uint8(0xFF), mx_scale_bytes(amax_bits, fmt, scheme.mode))  # type: ignore[union-attr]
        # 2**(127 - s) is a normal float32 for every finite-group byte s in [0, 253].
        exponent = 127 - np.where(poisoned, 127, s.astype(np.int64))
        v = _bits.ftz(
            np.multiply(xf, _bits.pow2(_groups.expand(exponent, scheme, shape)), dtype=np.float32)
        )
        codes = _encode_elements(v, fmt, random, poisoned_elements)
        scale = s.astype(np.uint8)
    elif scheme.family == "nvfp4":
        codes, scale, global_scale = _quantize_nvfp4(xf, absb, scheme, random, amax, poisoned)
    else:
        raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

    if fmt.name == "float4_e2m1fn":
        codes = _layouts.pack_fp4(codes)
    return _qtensor.QTensor(
        codes=np.asarray(codes, dtype=np.uint8, order="C"),
        scale=np.asarray(scale, order="C"),
        global_scale=global_scale,
        scheme=scheme,
        shape=tuple(int(n) for n in shape),
        hp_dtype=hp_dtype,
    )


def _nvfp4_global(absb: np.ndarray, scheme) -> tuple[np.float32, np.float32, bool]:
    """(S_enc, S_dec, tensor poisoned) of spec §3.3; (1, 1, False) without a global scale."""
    one = np.float32(1)
    if not scheme.global_scale:
        return one, one, False
    tensor_amax_bits = np.max(absb, initial=0)
    if tensor_amax_bits >= _bits.INF_BITS:  # a non-finite tensor poisons every block
        return one, one, True
    if tensor_amax_bits == 0:
        return one, one, False
    tensor_amax = _bits.from_bits(np.asarray(tensor_amax_bits, np.uint32))
    with np.errstate(over="ignore"):
        s_enc = np.minimum(
            np.divide(np.float32(2688), tensor_amax, dtype=np.float32), _bits.FLT_MAX
        )
    s_dec = _bits.ftz(np.divide(one, s_enc, dtype=np.float32))
    return np.float32(s_enc), np.float32(s_dec), False


def _quantize_nvfp4(xf, absb, scheme, random, block_amax, block_poisoned):
    """Transformer Engine's NVFP4 formula (spec §3.3), with lowp's poisoning (§6)."""
    s_enc, s_dec, tensor_poisoned = _nvfp4_global(absb, scheme)
    if tensor_poisoned:
        block_poisoned = np.ones_like(block_poisoned)
    one = np.float32(1)
    k = np.multiply(s_enc, np.divide(one, np.float32(6), dtype=np.float32), dtype=np.float32)
    with np.errstate(over="ignore"):  # amax*k and x*inv may overflow: min/clamp bound them
        sb_value = np.minimum(
            _bits.ftz(np.multiply(block_amax, k, dtype=np.float32)), np.float32(448)
        )
        sb = _formats.encode_in_range(sb_value, _E4M3)
        p = _bits.ftz(np.multiply(_formats.decode(sb, _E4M3), s_dec, dtype=np.float32))
        safe_p = np.where(p == 0, one, p)
        inv = np.where(
            p == 0,
            _bits.FLT_MAX,
            np.minimum(np.divide(one, safe_p, dtype=np.float32), _bits.FLT_MAX),
        )
        v = np.multiply(xf, _groups.expand(inv, scheme, xf.shape), dtype=np.float32)
    codes = _encode_elements(v, _E2M1, random, _groups.expand(block_poisoned, scheme, xf.shape))
    scale = np.where(block_poisoned, np.uint8(_E4M3.nan_codes[0]), sb).astype(np.uint8)
    global_scale = None
    if scheme.global_scale:
        stored = _bits.from_bits(_bits.NAN_F32) if tensor_poisoned else s_dec
        global_scale = np.asarray(stored, dtype=np.float32).reshape(())
    return codes, scale, global_scale


def _plain_scale(q: _qtensor.QTensor) -> np.ndarray:
    return q.with_scale_layout("plain").scale


def poisoned_groups(q: _qtensor.QTensor) -> np.ndarray:
    """Boolean, plain scale shape: the groups whose stored scale is the NaN of its format."""
    scale = _plain_scale(q)
    family = q.scheme.family
    if family == "float":
        return np.isnan(scale)
    if family == "mx":
        return scale == 0xFF
    if family == "nvfp4":
        bad = (scale & 0x7F) == 0x7F
        if q.global_scale is not None and np.isnan(q.global_scale):
            bad = np.ones_like(bad)
        return bad
    raise TypeError(f"unknown scheme family {family!r} of {q.scheme!r}")


def dequantize(q: _qtensor.QTensor, out_dtype: str | None = None) -> np.ndarray:
    """The values `q` stands for, as `out_dtype` (default: the dtype it was quantized from).

    Poisoned groups give the canonical NaN of `out_dtype`; everything else is
    `RN_out(ftz(RN32(value(code) * scale)))` per spec §3.

    Args:
      q: a QTensor from `quantize` or `load`.
      out_dtype: "float32", "bfloat16", "float16" or None.
    """
    if not isinstance(q, _qtensor.QTensor):
        raise TypeError(f"dequantize takes a lowp.QTensor, got {type(q).__name__}")
    if q.origin is not None:  # read from another tool's checkpoint: its producer's arithmetic
        from lowp import checkpoints

        return checkpoints.producer_dequantize(q, out_dtype)
    out_dtype = q.hp_dtype if out_dtype is None else out_dtype
    if out_dtype not in _NUMPY_DTYPES:
        raise ValueError(
            f"out_dtype must be one of {tuple(_NUMPY_DTYPES)} or None, got {out_dtype!r}"
        )
    scheme = q.scheme
    fmt = _formats.element_format(scheme.fmt)
    codes = _layouts.unpack_fp4(q.codes) if fmt.name == "float4_e2m1fn" else q.codes
    values = _formats.decode(codes, fmt)
    scale = _plain_scale(q)

    # A finite input near FLT_MAX can dequantize to +-Inf where the scale rounded up
    # (pow2, MX ceil/rceil): IEEE rounding of the product, documented, not warned about.
    with np.errstate(over="ignore", invalid="ignore"):
        # A stored float32 scale is an input of the product: flushed (spec §0.2), which
        # matters only for a hand-made one (quantize's are >= EPS / max, normal).
        if scheme.family == "float":
            scale = _bits.ftz(np.asarray(scale, np.float32))
            out = np.multiply(values, _groups.expand(scale, scheme, q.shape), dtype=np.float32)
        elif scheme.family == "mx":
            exponent = np.where(scale == 0xFF, 127, scale.astype(np.int64)) - 127
            out = _bits.mul_pow2(values, _groups.expand(exponent, scheme, q.shape))
        elif scheme.family == "nvfp4":
            s_dec = np.float32(1) if q.global_scale is None else _bits.ftz(q.global_scale)
            p = _bits.ftz(np.multiply(_formats.decode(scale, _E4M3), s_dec, dtype=np.float32))
            out = np.multiply(values, _groups.expand(p, scheme, q.shape), dtype=np.float32)
        else:
            raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

    out = _bits.ftz(out)
    poisoned = _groups.expand(poisoned_groups(q), scheme, q.shape) | np.isnan(out)
    with np.errstate(over="ignore"):  # RN_out may overflow float16 to +-Inf, as IEEE says
        result = out.astype(_NUMPY_DTYPES[out_dtype])
    nan = np.array(
        _CANONICAL_NAN_BITS[out_dtype], dtype=np.uint32 if out_dtype == "float32" else np.uint16
    )
    return np.where(poisoned, nan.view(_NUMPY_DTYPES[out_dtype]), result)
