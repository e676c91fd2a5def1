"""`quantize` and `dequantize` on JAX arrays: the bytes of `lowp.quantize`, on every backend.

Each scale family's algorithm (`scheme.family`: float, MX, NVFP4) is one branch of
`quantize` and one of `dequantize`, in the order spec §3 gives, with the hazards of
spec §0 taken out of XLA's hands:

- inputs and outputs are converted, flushed, clamped and compared as integer patterns;
- every division goes through `_exact.div_rn` (JAX's `/` is not correctly rounded on
  GPUs, and XLA turns division by a constant into multiplication on every backend);
- stored products (scales, dequantized values) go through `_exact.mul_narrow`;
- element codes come from lowp's integer encoder, ported to uint32 operations, or for
  float8 from XLA's convert of clamped, flushed values; on sm_90+ GPUs the float8
  tensorwise and rowwise casts run as one Pallas kernel (`_pallas_cast`), and so does
  `quantize_transposed`'s rowwise cast of a transpose, which reads x untransposed.

The float multiplications left, `x*m`, `x*2**k`, `x*inv`, `amax*k` and `S_enc*RN32(1/6)`,
are exact, or round to a normal float32, or feed only the element encoder, where a
product that XLA on CPU flushes and IEEE rounds up to 2**-126 gives the same signed-zero
code in every element format.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import checkify

import lowp
from lowp import extend
from lowp_jax import _bits, _dtypes, _encode, _exact, _groups, _layouts, _pallas_cast, _qarray
from lowp_jax import _rounding as _jax_rounding

_EPS_BITS = _bits.f32_pattern(extend.EPS)  # 0x2B8CBCCC, the float-scale amax floor
_E4M3 = extend.FLOAT8_E4M3FN
_E2M1 = extend.FLOAT4_E2M1FN
_ONE_SIXTH = np.float32(1) / np.float32(6)  # RN32(1/6), rounded once on the host


def _hp_input(x, name: str) -> tuple[jax.Array, str]:
    """An accepted input as a JAX array, and its dtype name; TypeError for the rest (§0.1)."""
    hp_dtype = check_input(x, name)
    return lax.stop_gradient(jnp.asarray(x)), hp_dtype


def check_input(x, name: str) -> str:
    """The dtype name of an accepted input (a JAX or NumPy array or NumPy scalar of
    float32, bfloat16 or float16); TypeError naming what else it is (spec §0.1)."""
    if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
        raise TypeError(
            f"{name}: lowp_jax.quantize takes a JAX or NumPy array, got {type(x).__name__}"
        )
    if x.dtype.byteorder == ">":  # else jnp.asarray fails deep inside JAX
        raise TypeError(
            f"{name}: a big-endian array ({x.dtype.str}); convert it with "
            "x.astype(x.dtype.newbyteorder('<'))"
        )
    if x.dtype == np.float64:
        raise TypeError(
            f"{name}: float64 input is refused (float64 -> float32 -> float8 rounds twice); "
            "cast to float32 first if that is what you mean"
        )
    hp_dtype = _dtypes.dtype_name(x.dtype)
    if hp_dtype is None:
        raise TypeError(f"{name}: input dtype {x.dtype} is not float32, bfloat16 or float16")
    return hp_dtype


def _is_zero_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) == 0


def _rounding_args(shape, rounding, random_bits, seed, offset, name):
    """Validated (random_bits, seed, offset) for the jitted core: all None for nearest;
    explicit bits, or the seed and offset as uint32 scalars, for stochastic."""
    source = extend.random_source(rounding, random_bits, seed, _is_zero_int(offset), name)
    if source == "none":
        return None, None, None
    if source == "seed":
        return (
            None,
            _jax_rounding.as_uint32(seed, "seed"),
            _jax_rounding.as_uint32(offset, "offset"),
        )
    if not isinstance(random_bits, (jax.Array, np.ndarray)) or random_bits.dtype != np.uint32:
        raise TypeError(f"{name}: random_bits must be a uint32 array, got {random_bits!r:.80}")
    if tuple(random_bits.shape) != tuple(shape):
        raise ValueError(
            f"{name}: random_bits has shape {tuple(random_bits.shape)}, the input {tuple(shape)}; "
            "one per element"
        )
    return jnp.asarray(random_bits), None, None


def random_for(shape, rounding, random_bits, seed, offset, name) -> jax.Array | None:
    """The uint32 per element that stochastic rounding consumes, or None for nearest."""
    random, seed, offset = _rounding_args(shape, rounding, random_bits, seed, offset, name)
    return random if seed is None else _jax_rounding.random_bits(seed, shape, offset)


@jax.jit
def _non_finite(x):
    """(count, flat index of the first) of the NaN/Inf elements of x."""
    bad = (_dtypes.to_f32_bits(x) & _bits.ABS) >= _bits.INF_BITS
    return jnp.sum(bad, dtype=jnp.int32), jnp.argmax(bad.reshape(-1))


def _check_finite(x: jax.Array, name: str) -> None:
    """FloatingPointError naming the tensor (eager), or a checkify check (traced)."""
    if x.size == 0:
        return
    count, first = _non_finite(x)
    if isinstance(x, jax.core.Tracer):
        parts = ", ".join(f"{{i{k}}}" for k in range(x.ndim))
        index = f"({parts},)" if x.ndim == 1 else f"({parts})"  # as Python prints tuples
        checkify.check(
            count == 0,
            f"{name}: {{count}} non-finite element(s), the first at index {index}; "
            "check_finite=True refuses to quantize",
            count=count,
            **{f"i{k}": i for k, i in enumerate(jnp.unravel_index(first, x.shape))},
        )
        return
    if int(count):
        index = tuple(int(i) for i in np.unravel_index(int(first), x.shape))
        value = abs(float(np.asarray(x).reshape(-1)[int(first)]))
        raise FloatingPointError(
            f"{name}: {int(count)} non-finite element(s), the first at index {index} "
            f"(|x| = {value}); check_finite=True refuses to quantize"
        )


def _encode_elements(v_bits, fmt, random, poisoned_elements) -> jax.Array:
    """Clamp to +-max, flush, round to codes; code 0 in poisoned groups.

    Poisoned elements are zeroed before rounding, and +0 rounds to code 0 under both
    roundings (stochastic rounding never steps up from a zero fraction), so no select
    follows the encoder: a float8 code comes straight out of XLA's convert.
    """
    b = _bits.ftz_bits(_bits.min_bits(v_bits, _encode.max_bits(fmt)))
    b = jnp.where(poisoned_elements, np.uint32(0), b)
    return _jax_rounding.round_elements(b, fmt, random)


def _flushed(x) -> tuple[jax.Array, jax.Array]:
    """(xf, |x| patterns): x as float32 with subnormals flushed (spec §0.2), and the
    uint32 patterns of its magnitudes (an exact, NaN-aware key for maxima)."""
    xb = _bits.ftz_bits(_dtypes.to_f32_bits(x))
    return _bits.from_bits(xb), xb & _bits.ABS


def _group_amax(absb, scheme) -> tuple[jax.Array, jax.Array]:
    """(amax, poisoned) of each group of `scheme`, in its plain scale shape: the largest
    |x| pattern, 0 in a poisoned group, and whether the group holds a NaN or Inf."""
    amax_bits = _groups.group_max(absb, scheme)
    poisoned = amax_bits >= _bits.INF_BITS
    return jnp.where(poisoned, np.uint32(0), amax_bits), poisoned


def _float_group_scales(absb, scheme, fmt) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(m, scale, poisoned) of each group of a float-scaled scheme (spec §3.1, §6): the
    encode multiplier, the stored decode scale (NaN for a poisoned group), poisoned."""
    amax_bits, poisoned = _group_amax(absb, scheme)
    m, d = _float_scales(amax_bits, fmt, scheme.pow2)
    return m, jnp.where(poisoned, _bits.from_bits(_bits.NAN_BITS), d), poisoned


def _float_scales(amax_bits, fmt, pow2: bool) -> tuple[jax.Array, jax.Array]:
    """Encode multiplier m and stored decode scale d (spec §3.1), both exact divisions;
    a power-of-two m and its reciprocal come from exponent bits, with the same result."""
    amax = _bits.from_bits(jnp.maximum(amax_bits, _EPS_BITS))
    if pow2:
        m = _exact.pow2_floor_div(fmt.max, amax)
        return m, _exact.reciprocal_pow2(m)
    m = _exact.div_rn(np.float32(fmt.max), amax)
    return m, _exact.div_rn(np.float32(1), m)


def _mx_scale_bytes(amax_bits, fmt, mode: str) -> jax.Array:
    """The e8m0 byte (int32) of each finite group amax (spec §3.2), from exponent bits only."""
    exponent = _bits.biased_exponent(amax_bits)
    mantissa = amax_bits & _bits.MANT_MASK
    if mode == "floor":
        up = 0
    elif mode == "ceil":
        up = (mantissa != 0).astype(jnp.int32)
    elif mode == "rceil":
        up = (mantissa > fmt.max_mantissa).astype(jnp.int32)
    else:
        raise ValueError(f"unknown MX mode {mode!r}")
    return jnp.maximum(exponent + up - fmt.emax, 0)


def quantize(
    x,
    scheme: lowp.Scheme,
    *,
    rounding: str = "nearest",
    random_bits=None,
    seed=None,
    offset=0,
    check_finite: bool = False,
    name: str = "input",
) -> _qarray.QArray:
    """Quantize `x` with `scheme`: the bytes of `lowp.quantize(np.asarray(x), scheme)`.

    Pure and jit-able with the scheme (and rounding, check_finite, name) static:
    `jax.jit(functools.partial(lowp_jax.quantize, scheme=scheme))`. Works on CPU and GPU
    with float32 arithmetic only (no x64 needed).

    Args:
      x: float32, bfloat16 or float16 array (JAX or NumPy) of any shape the scheme admits.
        float64 is refused (it would round twice).
      scheme: a lowp scheme (`lowp.extend.SCHEME_TYPES`).
      rounding: "nearest" (ties to even) or "stochastic" (spec §4).
      random_bits: uint32 array shaped like `x`, for stochastic rounding.
      seed, offset: instead of random_bits, draw `lowp.random_bits(seed, x.shape, offset)`
        (bit-identical). Python ints (taken mod 2**32; static under jit) or integer scalar
        arrays (traced: pass `jnp.uint32(seed)` to vary it without recompiling).
      check_finite: refuse NaN/Inf instead of poisoning their groups. Eagerly (outside any
        transformation) this raises FloatingPointError naming the tensor and the first bad
        index. Under `jit`, exceptions cannot be raised from inside the computation, so it
        adds a `jax.experimental.checkify` check, and the caller must functionalize it:
        `err, q = checkify.checkify(jax.jit(f))(x)` then `err.throw()`, which raises
        `checkify.JaxRuntimeError` with the same message. Staging it without `checkify`
        fails at trace time with checkify's "not functionalized" error.
      name: how errors refer to `x` (a parameter name, say).

    Returns:
      A QArray with the plain scale layout. The result carries no gradient: quantization
      is piecewise constant, and x enters through `lax.stop_gradient` (see
      `lowp_jax.fake_quantize` for a straight-through estimator).

    >>> import jax.numpy as jnp, lowp, lowp_jax
    >>> q = lowp_jax.quantize(jnp.array([1.0, -2.0, 448.0]), lowp.TensorScaling())
    >>> lowp_jax.to_lowp(q).codes.tolist(), float(q.scale)
    ([56, 192, 126], 1.0)
    """
    extend.check_scheme(scheme)
    x, _ = _hp_input(x, name)
    scheme.check_shape(tuple(x.shape))
    random, seed, offset = _rounding_args(x.shape, rounding, random_bits, seed, offset, name)
    if check_finite:
        _check_finite(x, name)
    return _quantize(x, random, seed, offset, scheme=scheme)


# Jitted inside, so that eager calls run as one compiled computation (cached per scheme,
# shape and dtype) instead of op by op; under an outer jit it is inlined.
@functools.partial(jax.jit, static_argnames=("scheme",))
def _quantize(x, random, seed, offset, *, scheme) -> _qarray.QArray:
    """The arithmetic of `quantize` on a validated input."""
    hp_dtype = _dtypes.dtype_name(x.dtype)
    shape = tuple(x.shape)
    if seed is not None:
        random = _jax_rounding.random_bits(seed, shape, offset)
    xf, absb = _flushed(x)
    fmt = extend.element_format(scheme.fmt)
    global_scale = None

    if scheme.family == "float":
        m, scale, poisoned = _float_group_scales(absb, scheme, fmt)
        codes = _float_scaled_codes(x, xf, m, poisoned, scheme, fmt, random)
    elif scheme.family == "mx":
        amax_bits, poisoned = _group_amax(absb, scheme)
        s = jnp.where(poisoned, 0xFF, _mx_scale_bytes(amax_bits, fmt, scheme.mode))
        # 2**(127 - s) is a normal float32 for every finite-group byte s in [0, 253].
        exponent = 127 - jnp.where(poisoned, 127, s)
        v = _bits.ftz_bits(_bits.bits(xf * _bits.pow2(_groups.expand(exponent, scheme, shape))))
        codes = _encode_elements(v, fmt, random, _groups.expand(poisoned, scheme, shape))
        scale = _qarray.store(s.astype(jnp.uint8), "float8_e8m0fnu")
    elif scheme.family == "nvfp4":
        amax_bits, poisoned = _group_amax(absb, scheme)
        codes, scale, global_scale = _quantize_nvfp4(xf, absb, scheme, random, amax_bits, poisoned)
    else:
        raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

    if fmt.name == "float4_e2m1fn":
        codes = _layouts.pack_fp4(codes)
    return _qarray.QArray(
        codes=_qarray.store(codes, fmt.name),
        scale=scale,
        global_scale=global_scale,
        scheme=scheme,
        shape=shape,
        hp_dtype=hp_dtype,
    )


def _float_scaled_codes(
    x, xf, m, poisoned, scheme, fmt, random, *, transposed: bool = False
) -> jax.Array:
    """uint8 codes of ftz(xf * m) for each group's multiplier m, code 0 where poisoned;
    with `transposed`, those codes of the rank-2 x transposed (`scheme` then groups x's
    columns, AxisScaling(axis=0)).

    On an NVIDIA GPU of compute capability 9.0+ a float8 cast rounding to nearest runs
    as one Pallas kernel (`_pallas_cast`, the same bytes in three instructions an
    element, written transposed by the kernel itself); the choice is made when the
    computation is lowered for its platform.
    """
    shape = tuple(x.shape)

    def in_xla(xf, m, poisoned):
        v = _bits.ftz_bits(_bits.bits(xf * _groups.expand(m, scheme, shape)))
        codes = _encode_elements(v, fmt, random, _groups.expand(poisoned, scheme, shape))
        return codes.T if transposed else codes

    if random is not None or not _pallas_cast.applies(
        scheme, fmt.name, shape, transposed=transposed
    ):
        return in_xla(xf, m, poisoned)

    def in_pallas(xf, m, poisoned):
        # The kernel reads x itself, in its own dtype (fewer bytes than float32 xf), and
        # flushes it in its product.
        multiplier = jnp.where(poisoned, np.float32(np.nan), m)
        codes = _pallas_cast.cast(
            x, multiplier, fmt_name=fmt.name, fmt_max=fmt.max, native=True, transposed=transposed
        )
        return lax.bitcast_convert_type(codes, jnp.uint8)

    return lax.platform_dependent(xf, m, poisoned, cuda=in_pallas, default=in_xla)


def quantize_transposed(x, scheme: lowp.Scheme, *, name: str = "input") -> _qarray.QArray:
    """`quantize(x.T, scheme, name=name)` of a rank-2 x: the same QArray, byte for byte.

    Where the float8 kernel runs (`_pallas_cast.applies`: an sm_90+ GPU) and `scheme` is
    AxisScaling along x.T's last axis (one scale per column of x), the column maxima are
    reduced on x and the kernel reads x in its own layout and writes the codes
    transposed: x is never copied transposed in high precision. Anywhere else (CPU,
    another scheme or format) this is `quantize(x.T, scheme, name=name)` itself. Nearest
    rounding; like `quantize`, the result carries no gradient.

    Args:
      x: float32, bfloat16 or float16 array (JAX or NumPy) of rank 2, (R, C).
      scheme: a lowp scheme that admits x.T, (C, R).
      name: how errors refer to the quantized tensor x.T.
    """
    extend.check_scheme(scheme)
    x, _ = _hp_input(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name}: quantize_transposed takes a rank-2 array, got shape {x.shape}")
    scheme.check_shape(x.shape[::-1])
    fmt_name = extend.element_format(scheme.fmt).name
    if not isinstance(scheme, lowp.AxisScaling) or not _pallas_cast.applies(
        _axis_swapped(scheme), fmt_name, tuple(x.shape), transposed=True
    ):
        return quantize(x.T, scheme, name=name)
    return _quantize_transposed(x, scheme=scheme)


def _axis_swapped(scheme: lowp.AxisScaling) -> lowp.AxisScaling:
    """The AxisScaling that groups a rank-2 x as `scheme` groups x.T (x.T's axis 1 is
    x's axis 0): one scale per column of x for `scheme`'s one per row of x.T."""
    return scheme.permuted((1, 0))


@functools.partial(jax.jit, static_argnames=("scheme",))
def _quantize_transposed(x, *, scheme) -> _qarray.QArray:
    """The arithmetic of `quantize_transposed` where the kernel applies: `_quantize`'s
    float-scaled branch for x.T, computed on x (its columns are x.T's rows)."""
    columns = _axis_swapped(scheme)
    fmt = extend.element_format(scheme.fmt)
    xf, absb = _flushed(x)
    m, scale, poisoned = _float_group_scales(absb, columns, fmt)
    codes = _float_scaled_codes(x, xf, m, poisoned, columns, fmt, None, transposed=True)
    return _qarray.QArray(
        codes=_qarray.store(codes, fmt.name),
        scale=scale.T,
        global_scale=None,
        scheme=scheme,
        shape=tuple(x.shape[::-1]),
        hp_dtype=_dtypes.dtype_name(x.dtype),
    )


def _nvfp4_global(absb, scheme) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(S_enc, S_dec, tensor poisoned) of spec §3.3; (1, 1, False) without a global scale."""
    one = jnp.float32(1)
    if not scheme.global_scale:
        return one, one, jnp.bool_(False)
    tensor_amax_bits = jnp.max(absb, initial=0)
    poisoned = tensor_amax_bits >= _bits.INF_BITS  # a non-finite tensor poisons every block
    trivial = poisoned | (tensor_amax_bits == 0)
    tensor_amax = _bits.from_bits(jnp.where(trivial, _bits.f32_pattern(1.0), tensor_amax_bits))
    s_enc = _exact.div_rn(np.float32(2688), tensor_amax)  # may overflow to Inf: clamp
    s_enc = _bits.from_bits(jnp.minimum(_bits.bits(s_enc), _bits.FLT_MAX_BITS))
    s_dec = _exact.div_rn(one, s_enc)
    return jnp.where(trivial, one, s_enc), jnp.where(trivial, one, s_dec), poisoned


def _quantize_nvfp4(xf, absb, scheme, random, block_amax_bits, block_poisoned):
    """Transformer Engine's NVFP4 formula (spec §3.3), with lowp's poisoning (§6)."""
    s_enc, s_dec, tensor_poisoned = _nvfp4_global(absb, scheme)
    block_poisoned = block_poisoned | tensor_poisoned
    # The barrier keeps XLA from reassociating S_enc * RN32(1/6) into the products below.
    k = lax.optimization_barrier(s_enc * _ONE_SIXTH)
    sb_value = _bits.ftz_bits(_bits.bits(_bits.from_bits(block_amax_bits) * k))
    sb = _encode.encode(jnp.minimum(sb_value, _bits.f32_pattern(448.0)), _E4M3)
    p = _exact.mul_narrow(_encode.decode(sb, _E4M3), s_dec)
    p_zero = p == 0
    inv = _exact.div_rn(np.float32(1), jnp.where(p_zero, jnp.float32(1), p))
    inv = jnp.where(p_zero, _bits.FLT_MAX_BITS, jnp.minimum(_bits.bits(inv), _bits.FLT_MAX_BITS))
    v = xf * _groups.expand(_bits.from_bits(inv), scheme, xf.shape)  # may overflow: clamped below
    poisoned_elements = _groups.expand(block_poisoned, scheme, xf.shape)
    codes = _encode_elements(_bits.bits(v), _E2M1, random, poisoned_elements)
    scale = _qarray.store(
        jnp.where(block_poisoned, np.uint8(_E4M3.nan_codes[0]), sb), "float8_e4m3fn"
    )
    global_scale = None
    if scheme.global_scale:
        global_scale = jnp.where(tensor_poisoned, _bits.from_bits(_bits.NAN_BITS), s_dec)
    return codes, scale, global_scale


def _out_dtype_name(out_dtype, hp_dtype: str) -> str:
    if out_dtype is None:
        return hp_dtype
    name = out_dtype if isinstance(out_dtype, str) else None
    if name is None:
        try:
            name = np.dtype(out_dtype).name
        except TypeError:
            name = repr(out_dtype)
    if name not in _dtypes.HP_DTYPES:
        raise ValueError(
            f"out_dtype must be one of {tuple(_dtypes.HP_DTYPES)} or None, got {out_dtype!r}"
        )
    return name


def dequantize(q: _qarray.QArray, out_dtype=None) -> jax.Array:
    """The values `q` stands for: the bits of `lowp.dequantize(to_lowp(q), out_dtype)`.

    Poisoned groups give the canonical NaN of `out_dtype`; everything else is
    `RN_out(ftz(RN32(value(code) * scale)))` per spec §3. Pure and jit-able. The result
    is a constant with respect to q's leaves (no gradient flows into codes or scales).

    Args:
      q: a QArray from `quantize` or `from_lowp` (either scale layout).
      out_dtype: "float32", "bfloat16", "float16" (or those dtypes), or None for q.hp_dtype.
    """
    if not isinstance(q, _qarray.QArray):
        raise TypeError(f"dequantize takes a lowp_jax.QArray, got {type(q).__name__}")
    return _dequantize(q, out_dtype=_out_dtype_name(out_dtype, q.hp_dtype))


@functools.partial(jax.jit, static_argnames=("out_dtype",))
def _dequantize(q: _qarray.QArray, *, out_dtype: str) -> jax.Array:
    """The arithmetic of `dequantize`."""
    q = q.with_scale_layout("plain")
    scheme, shape = q.scheme, q.shape
    fmt = extend.element_format(scheme.fmt)
    codes = _qarray.code_bytes(lax.stop_gradient(q.codes))
    if fmt.name == "float4_e2m1fn":
        codes = _layouts.unpack_fp4(codes)
    values = _encode.decode(codes, fmt)
    scale = lax.stop_gradient(q.scale)

    if scheme.family == "float":
        out = _exact.mul_narrow(values, _groups.expand(scale, scheme, shape))
        poisoned = jnp.isnan(scale)
    elif scheme.family == "mx":
        s = _qarray.code_bytes(scale).astype(jnp.int32)
        poisoned = s == 0xFF
        exponent = jnp.where(poisoned, 127, s) - 127
        out = _bits.mul_pow2(
            values, _groups.expand(exponent, scheme, shape)
        )  # exact unless flushed
    elif scheme.family == "nvfp4":
        sb = _qarray.code_bytes(scale)
        s_dec = jnp.float32(1) if q.global_scale is None else lax.stop_gradient(q.global_scale)
        p = _exact.mul_narrow(_encode.decode(sb, _E4M3), s_dec)
        out = _exact.mul_narrow(values, _groups.expand(p, scheme, shape))
        poisoned = ((sb & 0x7F) == 0x7F) | jnp.isnan(s_dec)
    else:
        raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

    out_bits = _bits.ftz_bits(_bits.bits(out))
    poisoned = _groups.expand(poisoned, scheme, shape) | _bits.is_nan_bits(out_bits)
    result = _dtypes.from_f32_bits(out_bits, out_dtype)
    nan = lax.bitcast_convert_type(
        np.array(
            _dtypes.CANONICAL_NAN_BITS[out_dtype],
            np.uint32 if out_dtype == "float32" else np.uint16,
        ),
        _dtypes.HP_DTYPES[out_dtype],
    )
    return jnp.where(poisoned, nan, result)
