"""`quantize` and `dequantize` in torch, byte for byte the NumPy reference `lowp`.

Each scale family's algorithm (`scheme.family`: float, MX, NVFP4) is written out in one
branch, in the order of spec §3 and of `lowp/_quantize.py`; groups come from the
scheme's tiles (`_groups`). What keeps CPU, CUDA, eager and torch.compile on the same bytes
(spec §0): integer ops on float32 bits for every max, exponent, flush and code;
float32 products each rounded once, none feeding an inexact add (so a contracted FMA
changes nothing); divisions in float64 rounded once to float32 (`_bits.div_rn32`);
no float division by a constant (Inductor turns it into a reciprocal multiply); a
native float8 cast only of values already clamped, flushed and poisoned, and only where
it rounds to nearest even in one step (`_encode`), never for float6/float4 or scales
built from exponents; shapes and schemes are Python values, so no branch depends on
data and nothing syncs with the host (except `check_finite=True`).

In eager mode on CUDA, `quantize` hands the fp8 tensor, axis and MX schemes to fused
Triton kernels (`_triton_casts`; `_cast_kernels` says when): the same bytes, at
memory bandwidth.
"""

import numpy as np
import torch

import lowp
from lowp import extend
from lowp_torch import (
    _bits,
    _cast_kernels,
    _encode,
    _groups,
    _layouts,
    _qtensor,
    _rounding,
    _storage,
)

_E4M3 = extend.FLOAT8_E4M3FN
_E2M1 = extend.FLOAT4_E2M1FN
_ONE_SIXTH = float(np.float32(1) / np.float32(6))  # RN32(1/6), exact as a Python float
_WHOLE_TENSOR = lowp.TensorScaling()  # the group of NVFP4's global amax


def _hp_input(t, name: str) -> torch.Tensor:
    """`t` as float32 (exact); TypeError for any other input (spec §0.1)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: lowp_torch.quantize takes a torch.Tensor, got {type(t).__name__}; "
            "use lowp.quantize for numpy arrays"
        )
    if isinstance(t, _qtensor.QuantizedTensor):
        raise TypeError(f"{name}: already quantized ({t.scheme}); dequantize() it first")
    if t.dtype == torch.float64:
        raise TypeError(
            f"{name}: float64 input is refused (float64 -> float32 -> float8 rounds twice); "
            "cast to float32 first if that is what you mean"
        )
    if t.dtype not in _storage.HP_DTYPES:
        raise TypeError(f"{name}: input dtype {t.dtype} is not float32, bfloat16 or float16")
    # Codes have no gradient; detaching keeps autograd from recording the bit arithmetic.
    return t.detach().to(torch.float32)


def _random_for(t, rounding, random_bits, seed, offset, name) -> torch.Tensor | None:
    """The uint32 (in int64) per element that stochastic rounding consumes, or None."""
    source = extend.random_source(rounding, random_bits, seed, offset == 0, name)
    if source == "none":
        return None
    if source == "seed":
        return _rounding.random_bits(seed, tuple(t.shape), offset, device=t.device)
    if not isinstance(random_bits, torch.Tensor) or random_bits.dtype not in (
        torch.uint32,
        torch.int64,
    ):
        raise TypeError(
            f"{name}: random_bits must be a uint32 torch tensor (or int64 holding uint32 "
            f"values), got {random_bits!r:.80}"
        )
    if random_bits.shape != t.shape:
        raise ValueError(
            f"{name}: random_bits has shape {tuple(random_bits.shape)}, the input "
            f"{tuple(t.shape)}; one per element"
        )
    if random_bits.device != t.device:
        raise ValueError(f"{name}: random_bits is on {random_bits.device}, the input on {t.device}")
    if random_bits.dtype == torch.uint32:
        # Few uint32 ops exist; reinterpret as int32 and widen, keeping the 32 bits.
        return random_bits.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return random_bits & 0xFFFFFFFF  # only the low 32 bits are read, as for uint32


def _check_finite(absb: torch.Tensor, name: str) -> None:
    """FloatingPointError naming the tensor if any element is NaN or ±Inf (a host sync)."""
    bad = absb >= _bits.INF_BITS
    if bool(bad.any()):
        flat = bad.reshape(-1)
        first_flat = int(torch.argmax(flat.to(torch.uint8)))
        first = np.unravel_index(first_flat, tuple(absb.shape))
        value = np.uint32(int(absb.reshape(-1)[first_flat])).view(np.float32)
        raise FloatingPointError(
            f"{name}: {int(flat.sum())} non-finite element(s), the first at index "
            f"{tuple(int(i) for i in first)} (|x| = {value}); check_finite=True refuses to quantize"
        )


def _encode_elements(v, fmt, random, poisoned_elements) -> torch.Tensor:
    """Clamp the flushed `v` to ±max and round to uint8 codes; code 0 in poisoned groups.

    `poisoned_elements` is an int32 mask (-1 in a poisoned group), broadcastable to v.
    Clamping to the normal ±max makes no subnormal, so v stays flushed; NaN (in
    poisoned groups only) becomes +0.0 there, whose code is 0 under either rounding.
    """
    v = torch.clamp(v, -fmt.max, fmt.max)
    v = _bits.from_bits(_bits.bits(v) & ~poisoned_elements)
    return _rounding.round_elements(v, fmt, random).to(torch.uint8)


def _poison_mask(poisoned: torch.Tensor, scheme, shape) -> torch.Tensor:
    """The bool group flags as an int32 mask (-1 poisoned) broadcast over the elements."""
    return _groups.expand(-poisoned.to(torch.int32), scheme, shape)


def _float_scales(amax_bits: torch.Tensor, fmt, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode multiplier m and stored decode scale d for float scales (spec §3.1)."""
    # max(amax, EPS) on the bits: exact for non-negative floats, whatever the FTZ mode.
    safe_amax = _bits.from_bits(torch.clamp(amax_bits, min=_bits.EPS_BITS))
    m = _bits.div_rn32(fmt.max, safe_amax)
    if pow2:  # round down to a power of two by clearing the mantissa: exact, no log2
        m = _bits.from_bits(_bits.bits(m) & _bits.EXP_MASK)
    d = _bits.div_rn32(1.0, m)
    return m, d


def _mx_scale_bytes(amax_bits: torch.Tensor, fmt, mode: str) -> torch.Tensor:
    """The e8m0 byte (int32) of each finite group amax (spec §3.2), from exponent bits."""
    exponent = _bits.biased_exponent(amax_bits)
    mantissa = amax_bits & _bits.MANT_MASK
    if mode == "floor":
        up = torch.zeros_like(exponent)
    elif mode == "ceil":
        up = (mantissa != 0).to(torch.int32)
    elif mode == "rceil":
        up = (mantissa > fmt.max_mantissa).to(torch.int32)
    else:
        raise ValueError(f"unknown MX mode {mode!r}")
    return torch.clamp(exponent + up - fmt.emax, min=0)


def quantize(
    t: torch.Tensor,
    scheme: lowp.Scheme,
    *,
    rounding: str = "nearest",
    random_bits: torch.Tensor | None = None,
    seed: int | None = None,
    offset: int = 0,
    check_finite: bool = False,
    name: str = "input",
) -> _qtensor.QuantizedTensor:
    """Quantize `t` with `scheme`: the bytes `lowp.quantize` gives, on any device.

    Args:
      t: float32, bfloat16 or float16 tensor of any shape the scheme admits, on any
        device; float64 is refused (it would round twice).
      scheme: a lowp scheme (`lowp.extend.SCHEME_TYPES`).
      rounding: "nearest" (ties to even) or "stochastic" (spec §4).
      random_bits: for stochastic rounding, a uint32 tensor shaped like `t` on its
        device (or int64 holding uint32 values; only the low 32 bits are read).
      seed, offset: instead of random_bits: the bits of `lowp.random_bits(seed,
        t.shape, offset)`, computed on t's device.
      check_finite: raise FloatingPointError naming the tensor on NaN/Inf instead of
        poisoning the group (spec §6). This reads a flag back from the device: a host
        sync, and under torch.compile a graph break, where the error is raised before
        any code is made (with fullgraph=True, compilation refuses it).
      name: how errors refer to `t`.

    Returns:
      A QuantizedTensor on t's device with the plain scale layout: codes
      (float8_e4m3fn / float8_e5m2 / uint8 for float6 / float4_e2m1fn_x2 packed two a
      byte along the last axis), scale (float32, float8_e8m0fnu for MX, float8_e4m3fn
      for NVFP4) and, for NVFP4 with a global scale, a 0-d float32 global_scale.

    >>> import torch, lowp
    >>> x = torch.tensor([[0.5, -1.25, 3.0, 0.0] * 8])                # 1 x 32
    >>> q = quantize(x, lowp.MXScaling("float8_e4m3fn", mode="rceil"))
    >>> q.codes[0, :4].view(torch.uint8).tolist(), q.scale.view(torch.uint8).tolist()
    ([104, 242, 124, 0], [[120]])
    """
    extend.check_scheme(scheme)
    if _cast_kernels.use_triton(
        t,
        scheme,
        rounding=rounding,
        random_bits=random_bits,
        seed=seed,
        offset=offset,
        check_finite=check_finite,
        name=name,
    ):
        from lowp_torch import _triton_casts  # imports triton: only when it runs

        return _triton_casts.quantize(t, scheme)
    xf = _hp_input(t, name)
    hp_dtype = t.dtype
    shape = tuple(xf.shape)  # SymInts stay symbolic under torch.compile (no recompile per M)
    scheme.check_shape(shape)
    random = _random_for(xf, rounding, random_bits, seed, offset, name)
    xf = _bits.ftz(xf)
    absb = _bits.abs_bits(xf)
    if check_finite:
        _check_finite(absb, name)
    fmt = extend.element_format(scheme.fmt)
    amax_bits = _groups.group_max(absb, scheme)
    poisoned = amax_bits >= _bits.INF_BITS
    poisoned_elements = _poison_mask(poisoned, scheme, shape)
    amax_bits = torch.where(poisoned, 0, amax_bits)
    global_scale = None

    if scheme.family == "float":
        m, d = _float_scales(amax_bits, fmt, scheme.pow2)
        v = _bits.ftz(xf * _groups.expand(m, scheme, shape))
        codes = _encode_elements(v, fmt, random, poisoned_elements)
        scale = _bits.from_bits(torch.where(poisoned, _bits.NAN_F32, _bits.bits(d)))
    elif scheme.family == "mx":
        s = torch.where(poisoned, 0xFF, _mx_scale_bytes(amax_bits, fmt, scheme.mode))
        # 2**(127 - s) is a normal float32 for every finite-group byte s in [0, 253].
        exponent = 127 - torch.where(poisoned, 127, s)
        v = _bits.ftz(xf * _groups.expand(_bits.pow2(exponent), scheme, shape))
        codes = _encode_elements(v, fmt, random, poisoned_elements)
        scale = _storage.as_stored(s.to(torch.uint8), torch.float8_e8m0fnu)
    elif scheme.family == "nvfp4":
        codes, scale, global_scale = _quantize_nvfp4(xf, absb, scheme, random, amax_bits, poisoned)
    else:
        raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

    if fmt.name == "float4_e2m1fn":
        codes = _layouts.pack_fp4(codes)
    return _qtensor.QuantizedTensor(
        codes=_storage.as_stored(codes, _storage.CODE_DTYPES[fmt.name]),
        scale=scale,
        global_scale=global_scale,
        scheme=scheme,
        shape=shape,
        hp_dtype=hp_dtype,
    )


def _nvfp4_global(absb: torch.Tensor, scheme):
    """(S_enc, S_dec, tensor poisoned) of spec §3.3 as 0-d tensors, without a branch on data."""
    one = torch.ones((), dtype=torch.float32, device=absb.device)
    if not scheme.global_scale:
        return one, one, torch.zeros((), dtype=torch.bool, device=absb.device)
    tensor_amax_bits = _groups.group_max(absb, _WHOLE_TENSOR)
    tensor_poisoned = tensor_amax_bits >= _bits.INF_BITS  # a non-finite tensor poisons every block
    trivial = tensor_poisoned | (tensor_amax_bits == 0)  # both give S_enc = S_dec = 1
    tensor_amax = _bits.from_bits(torch.where(trivial, _bits.bits(one), tensor_amax_bits))
    s_enc = torch.where(trivial, one, _bits.div_rn32(2688.0, tensor_amax))  # min(., FLT_MAX) inside
    s_dec = torch.where(trivial, one, _bits.ftz(_bits.div_rn32(1.0, s_enc)))
    return s_enc, s_dec, tensor_poisoned


def _quantize_nvfp4(xf, absb, scheme, random, block_amax_bits, block_poisoned):
    """Transformer Engine's NVFP4 formula (spec §3.3), with lowp's poisoning (§6)."""
    s_enc, s_dec, tensor_poisoned = _nvfp4_global(absb, scheme)
    block_poisoned = block_poisoned | tensor_poisoned
    block_amax = _bits.from_bits(block_amax_bits)
    k = s_enc * _ONE_SIXTH
    # amax*k may overflow to Inf and x*inv to ±Inf: the min and the clamp bound them.
    sb_value = torch.clamp(_bits.ftz(block_amax * k), max=448.0)
    sb = _encode.encode(sb_value, _E4M3)
    p = _bits.ftz(_encode.decode(sb, _E4M3) * s_dec)
    p_is_zero = _bits.abs_bits(p) == 0
    safe_p = torch.where(p_is_zero, 1.0, p)
    inv = torch.where(
        p_is_zero, _bits.FLT_MAX, _bits.div_rn32(1.0, safe_p)
    )  # min(., FLT_MAX) inside
    v = _bits.ftz(xf * _groups.expand(inv, scheme, tuple(xf.shape)))
    codes = _encode_elements(
        v, _E2M1, random, _poison_mask(block_poisoned, scheme, tuple(xf.shape))
    )
    scale_bytes = torch.where(block_poisoned, _E4M3.nan_codes[0], sb.to(torch.int32)).to(
        torch.uint8
    )
    scale = _storage.as_stored(scale_bytes, torch.float8_e4m3fn)
    global_scale = None
    if scheme.global_scale:
        global_scale = _bits.from_bits(
            torch.where(tensor_poisoned, _bits.NAN_F32, _bits.bits(s_dec))
        ).reshape(())
    return codes, scale, global_scale


def _plain_scale_bytes_or_float(q: _qtensor.QuantizedTensor) -> torch.Tensor:
    """Plain-layout scales: float32 for float scales, else the uint8 scale codes."""
    scale = _qtensor.with_scale_layout(q, "plain").scale
    return scale if scale.dtype == torch.float32 else _storage.as_bytes(scale)


def _poisoned_groups(q: _qtensor.QuantizedTensor, scale: torch.Tensor) -> torch.Tensor:
    """Boolean, plain scale shape: the groups whose stored scale is its format's NaN."""
    scheme = _qtensor.scheme_of(q)
    if scheme.family == "float":
        return _bits.is_nan_bits(_bits.bits(scale))
    if scheme.family == "mx":
        return scale == 0xFF
    if scheme.family == "nvfp4":
        bad = (scale & 0x7F) == 0x7F
        if q.global_scale is not None:
            bad = bad | _bits.is_nan_bits(_bits.bits(q.global_scale))
        return bad
    raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")


def _products_may_be_subnormal(factors, fmt) -> bool:
    """Whether a code's value times its group's factors can be a float32 subnormal.

    The smallest nonzero magnitude of `fmt` is multiplied by each group's factors as the
    elements are; rounding is monotonic, so no larger magnitude's product lies below it,
    and a zero group factor gives zeros. A host sync.
    """
    smallest = torch.full_like(factors[0], fmt.min_subnormal)
    for factor in factors:
        smallest = smallest * factor
    magnitude = _bits.abs_bits(smallest)
    return bool(torch.any(_bits.negative_mask(magnitude - _bits.MIN_NORMAL_BITS) & magnitude))


def dequantize(q: _qtensor.QuantizedTensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The values `q` stands for, as `out_dtype` (default: the dtype it was quantized from).

    Poisoned groups give the canonical NaN of `out_dtype` (float32 0x7FC00000, bfloat16
    0x7FC0, float16 0x7E00), chosen by a select; everything else is
    `RN_out(ftz(RN32(value(code) * scale)))` per spec §3, bit-identical to
    `lowp.dequantize`.

    Args:
      q: a QuantizedTensor from `quantize` or `from_lowp`.
      out_dtype: torch.float32, torch.bfloat16, torch.float16 or None.

    Returns:
      A tensor of shape `q.shape` and dtype `out_dtype` on q's device.

    >>> import torch, lowp
    >>> q = quantize(torch.tensor([0.1, -3.0, 448.0]), lowp.TensorScaling())
    >>> dequantize(q).tolist()
    [0.1015625, -3.0, 448.0]
    """
    if not isinstance(q, _qtensor.QuantizedTensor):
        raise TypeError(f"dequantize takes a lowp_torch.QuantizedTensor, got {type(q).__name__}")
    out_dtype = q.hp_dtype if out_dtype is None else out_dtype
    if out_dtype not in _storage.HP_DTYPES:
        raise ValueError(
            f"out_dtype must be one of {tuple(_storage.HP_DTYPES)} or None, got {out_dtype!r}"
        )
    scheme, shape = _qtensor.scheme_of(q), tuple(q.shape)
    fmt = extend.element_format(scheme.fmt)
    codes = _storage.as_bytes(q.codes)
    if fmt.name == "float4_e2m1fn":
        values = _encode.decode_fp4_packed(codes, fmt)
    else:
        values = _encode.decode(codes, fmt)
    scale = _plain_scale_bytes_or_float(q)

    if scheme.family == "float":
        # the stored scale is an input of the product: flushed (spec §0.2; lowp's rule)
        factors = (_bits.ftz(scale),)
    elif scheme.family == "mx":
        s = scale.to(torch.int32)
        exponent = torch.where(s == 0xFF, 127, s) - 127
        factors = _bits.pow2_factors(exponent)  # mul_pow2, its two factors per group
    elif scheme.family == "nvfp4":
        s_dec = 1.0 if q.global_scale is None else _bits.ftz(q.global_scale)
        factors = (_bits.ftz(_encode.decode(scale, _E4M3) * s_dec),)
    else:
        raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")
    out = values
    for factor in factors:
        out = _groups.multiply(out, factor, scheme)

    poisoned_groups = _poisoned_groups(q, scale)
    # Eager on the CPU, where a host sync is cheap, the passes that only change a
    # subnormal or a NaN are skipped when there is none (docs/performance.md, CPU).
    on_host = q.device.type == "cpu" and not _storage.traced(out)
    if not on_host or _products_may_be_subnormal(factors, fmt):
        out = _bits.ftz(out)
    if on_host and not bool(poisoned_groups.any()) and not bool(torch.isnan(out.sum())):
        return out.to(out_dtype)  # no NaN to make canonical: the same bits
    poisoned = _poison_mask(poisoned_groups, scheme, shape)
    poisoned = poisoned | _bits.nan_mask(_bits.bits(out))
    int_dtype = _storage.SAME_WIDTH_INT[out_dtype]
    result = out.to(out_dtype).view(int_dtype)
    nan = _storage.CANONICAL_NAN_BITS[out_dtype]
    return _bits.select(poisoned.to(int_dtype), nan, result).view(out_dtype)
