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

import math

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
    _scratch,
    _storage,
)

_E4M3 = extend.FLOAT8_E4M3FN
_E2M1 = extend.FLOAT4_E2M1FN
_ONE_SIXTH = float(np.float32(1) / np.float32(6))  # RN32(1/6), exact as a Python float
_WHOLE_TENSOR = lowp.TensorScaling()  # the group of NVFP4's global amax
# An eager CPU call goes a slab of about this many elements at a time: 1 MiB of float32,
# so that the dozen passes over a slab stay in the cache (docs/performance.md).
CHUNK_ELEMENTS = 1 << 18


def _hp_input(t, name: str) -> torch.Tensor:
    """`t` detached, in its own dtype; TypeError for any input but a float32, bfloat16
    or float16 tensor (spec §0.1). Each slab is widened to float32 (exact) where it is
    quantized."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(
            f"{name}: lowp_torch.quantize takes a torch.Tensor, got {type(t).__name__}; "
            "use lowp.quantize for numpy arrays"
        )
    if isinstance(t, _qtensor.QuantizedTensor):
        raise TypeError(f"{name}: already quantized ({t.scheme}); dequantize() it first")
    # else "reshape is not implemented for sparse tensors". Not asked of a traced tensor:
    # a compiled backward's strict mode refuses the attribute, and traced ones are dense.
    if not _storage.traced(t) and t.layout != torch.strided:
        raise TypeError(
            f"{name}: a {t.layout} tensor of shape {tuple(t.shape)}; lowp quantizes dense "
            "tensors: convert it with t.to_dense()"
        )
    if t.dtype == torch.float64:
        raise TypeError(
            f"{name}: float64 input is refused (float64 -> float32 -> float8 rounds twice); "
            "cast to float32 first if that is what you mean"
        )
    if t.dtype not in _storage.HP_DTYPES:
        raise TypeError(f"{name}: input dtype {t.dtype} is not float32, bfloat16 or float16")
    # Codes have no gradient; detaching keeps autograd from recording the bit arithmetic.
    return t.detach()


def _random_for(t, rounding, random_bits, seed, offset, name, on_host: bool = False):
    """The bits stochastic rounding consumes, or None for nearest rounding: a function
    of a slab's first flat index in `t` and its shape, giving one uint32 (in int64) per
    element of the slab, the bits of those elements in the whole tensor (spec §4: a
    function of each element's index, so slabs change no bit). `on_host` (the eager CPU
    slabs): the same 32 bits as int32, what `_rounding.stochastic_codes_on_host` reads."""
    source = extend.random_source(rounding, random_bits, seed, offset == 0, name)
    if source == "none":
        return None
    if source == "seed" and on_host:
        _rounding.check_seed_and_offset(seed, offset)  # the host hash takes them as ints
        scratch = _scratch.Scratch()

        def from_seed_on_host(first: int, shape: tuple) -> torch.Tensor:
            at = int(offset) + first  # an int, or a 0-d int64 CPU tensor read here
            bits = _rounding.random_bits_on_host(seed, at, math.prod(shape), scratch)
            return bits.view(shape)

        return from_seed_on_host
    if source == "seed":

        def from_seed(first: int, shape: tuple) -> torch.Tensor:
            at = offset if first == 0 else offset + first  # an int, or a 0-d int64 tensor
            return _rounding.random_bits(seed, shape, at, device=t.device)

        return from_seed
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
    flat = random_bits.reshape(-1)

    scratch = _scratch.Scratch()

    def given(first: int, shape: tuple) -> torch.Tensor:
        part = flat[first : first + math.prod(shape)].reshape(shape)
        if on_host:  # the low 32 bits as int32, a copy (the element step overwrites it)
            bits = scratch.take("random", torch.int32, shape)
            return bits.copy_(part.view(torch.int32) if part.dtype == torch.uint32 else part)
        if part.dtype == torch.uint32:
            # Few uint32 ops exist; reinterpret as int32 and widen, keeping the 32 bits.
            return part.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return part & 0xFFFFFFFF  # only the low 32 bits are read, as for uint32

    return given


def _check_finite(slabs, shape: tuple, name: str) -> None:
    """FloatingPointError naming the tensor if any element is NaN or ±Inf (a host sync).

    `slabs`: (first flat index, float32 part) pairs that cover the input in C order."""
    count, first = 0, None
    for start, part in slabs:
        absb = _bits.abs_bits(part)
        bad = absb >= _bits.INF_BITS
        if not bool(bad.any()):
            continue
        flat = bad.reshape(-1)
        count += int(flat.sum())
        if first is None:
            at = int(torch.argmax(flat.to(torch.uint8)))
            first = (start + at, np.uint32(int(absb.reshape(-1)[at])).view(np.float32))
    if first is not None:
        index = np.unravel_index(first[0], shape)
        raise FloatingPointError(
            f"{name}: {count} non-finite element(s), the first at index "
            f"{tuple(int(i) for i in index)} (|x| = {first[1]}); check_finite=True refuses to quantize"
        )


def _encode_elements(v, fmt, random, poisoned, scheme) -> torch.Tensor:
    """Clamp the flushed `v` to ±max and round to uint8 codes; code 0 in poisoned groups.

    `poisoned`: bool, one a group of `scheme`. Clamping to the normal ±max makes no
    subnormal, so v stays flushed; NaN (in poisoned groups only) becomes +0.0 there,
    whose code is 0 under either rounding.
    """
    v = torch.clamp(v, -fmt.max, fmt.max)
    v = _bits.from_bits(_bits.bits(v) & ~_poison_mask(poisoned, scheme, tuple(v.shape)))
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
    chunk_elements: int = CHUNK_ELEMENTS,
) -> _qtensor.QuantizedTensor:
    """Quantize `t` with `scheme`: the bytes `lowp.quantize` gives, on any device.

    An eager call on a CPU tensor goes a slab of rows at a time, cut as `lowp.quantize`
    cuts them (`lowp.extend.slab_plan`), so the memory it takes beyond the output stays a
    few slabs and the work stays in the cache; everywhere else (CUDA, torch.compile,
    functorch transforms, subclasses) it is one pass of whole-tensor ops, which Inductor
    fuses. The bytes do not depend on the slabs.

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
      chunk_elements: about how many elements an eager CPU slab holds (at least one
        row, or one row of groups); changes memory and speed, never the result.

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
    x = _hp_input(t, name)
    shape = tuple(x.shape)  # SymInts stay symbolic under torch.compile (no recompile per M)
    scheme.check_shape(shape)
    on_host = _in_slabs(t)
    random = _random_for(x, rounding, random_bits, seed, offset, name, on_host)
    fmt = extend.element_format(scheme.fmt)
    extend.check_chunk_elements(chunk_elements, name)
    if on_host:
        plan = extend.slab_plan(
            shape, scheme, chunk_elements, contiguous=x.is_contiguous(), name=name
        )
        codes, scale, nvfp4 = _in_slabs_of(
            x.reshape(plan.shape), plan, fmt, random, check_finite, name, shape
        )
        codes = codes.reshape(shape[:-1] + codes.shape[-1:] if shape else ())
        scale = scale.reshape(scheme.scale_shape(shape))
    else:
        xf = _bits.ftz(x.to(torch.float32))
        if check_finite:
            _check_finite([(0, xf)], shape, name)
        amax_bits = _groups.group_max(_bits.abs_bits(xf), scheme)
        nvfp4 = _nvfp4_global(amax_bits, scheme, xf.device) if scheme.family == "nvfp4" else None
        multiplier, scale, poisoned = _group_scales(amax_bits, scheme, fmt, nvfp4)
        element_random = None if random is None else random(0, shape)
        codes = _element_codes(xf, multiplier, poisoned, scheme, fmt, element_random)

    global_scale = None
    if scheme.family == "mx":
        scale = _storage.as_stored(scale, torch.float8_e8m0fnu)
    elif scheme.family == "nvfp4":
        scale = _storage.as_stored(scale, torch.float8_e4m3fn)
        if scheme.global_scale:
            s_dec, tensor_poisoned = nvfp4[1], nvfp4[2]
            global_scale = _bits.from_bits(
                torch.where(tensor_poisoned, _bits.NAN_F32, _bits.bits(s_dec))
            ).reshape(())
    return _qtensor.QuantizedTensor(
        codes=_storage.as_stored(codes, _storage.CODE_DTYPES[fmt.name]),
        scale=scale,
        global_scale=global_scale,
        scheme=scheme,
        shape=shape,
        hp_dtype=t.dtype,
    )


def _group_scales(amax_bits, scheme, fmt, nvfp4, on_host: bool = False, inverses=None):
    """(encode multiplier (float32), stored scale (float32 for float scales, else its
    uint8 bytes), poisoned (bool)), one a group, from the groups' |x| maxima: int32
    patterns of the flushed input, non-finite for a poisoned group (spec §3, §6).

    `on_host` (an eager CPU slab, whose flags may be read): where no group is poisoned
    the selects that only change a poisoned group are left out (on the CPU a
    `torch.where` costs 20-50x an integer op of its size: docs/performance.md), and
    NVFP4's 1/p is read from `inverses` (`_nvfp4_inverses`)."""
    poisoned = amax_bits >= _bits.INF_BITS
    selects = not on_host or bool(poisoned.any())
    if selects:
        amax_bits = torch.where(poisoned, 0, amax_bits)
    if scheme.family == "float":
        m, d = _float_scales(amax_bits, fmt, scheme.pow2)
        if selects:
            d = _bits.from_bits(torch.where(poisoned, _bits.NAN_F32, _bits.bits(d)))
        return m, d, poisoned
    if scheme.family == "mx":
        s = _mx_scale_bytes(amax_bits, fmt, scheme.mode)
        if selects:
            s = torch.where(poisoned, 0xFF, s)
        # 2**(127 - s) is a normal float32 for every finite-group byte s in [0, 253].
        multiplier = _bits.pow2(127 - (torch.where(poisoned, 127, s) if selects else s))
        return multiplier, s.to(torch.uint8), poisoned
    if scheme.family == "nvfp4":
        if on_host:
            return _nvfp4_block_scales_on_host(amax_bits, poisoned, nvfp4, inverses)
        return _nvfp4_block_scales(amax_bits, poisoned, nvfp4)
    raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")


def _group_scales_on_host(amax_bits, scheme, fmt, nvfp4, inverses, grid: int = 0):
    """`_group_scales` of an eager CPU slab from its groups' |x| pattern maxima (not
    yet flushed), with None for `poisoned` where no group is, and whether the
    multipliers carry 2**grid (stochastic rounding's lift, `_rounding.grid_exponent`;
    0: none asked), which they do where every lifted one stays finite. One read of the
    maxima' least and greatest decides the rest: where a group is poisoned, or (float
    and NVFP4 scales) one's maximum is a float32 subnormal or zero, the general step on
    flushed maxima; else the MX and NVFP4 steps in int32 ops and no bool tensor (on the
    CPU a comparison or `any` on a bool tensor costs several integer ops of its size).
    `inverses`: NVFP4's tables (`_nvfp4_inverses`, and `_lifted_inverses` or None)."""
    inverses, lifted_inverses = inverses
    if amax_bits.numel() == 0:
        general = _group_scales(amax_bits, scheme, fmt, nvfp4, on_host=True, inverses=inverses)
        return (*general, False)
    low, high = (int(v) for v in torch.aminmax(amax_bits))
    # MX needs no flush: a subnormal's byte is 0 flushed or not (its exponent field is
    # 0, at most 1 with the carry, and emax >= 1).
    flush = low <= _bits.MANT_MASK and scheme.family != "mx"
    tensor_poisoned = nvfp4 is not None and bool(nvfp4[2])
    if high >= _bits.INF_BITS or flush or tensor_poisoned or scheme.family == "float":
        amax_bits = _flushed_max(amax_bits) if flush else amax_bits
        general = _group_scales(amax_bits, scheme, fmt, nvfp4, on_host=True, inverses=inverses)
        return (*general, False)
    if scheme.family == "mx":
        # exponent + up of `_mx_scale_bytes` in one carry: up is whether the mantissa
        # field passes the mode's bound (none for floor, 0 for ceil, Mc for rceil)
        carry = (
            0
            if scheme.mode == "floor"
            else _bits.MANT_MASK - (fmt.max_mantissa if scheme.mode == "rceil" else 0)
        )
        biased = torch.clamp((amax_bits + carry) >> 23, min=fmt.emax)  # the byte s, + emax
        # 2**(127 - s + lift): the pattern (254 - s + lift) << 23, a normal float32 for s
        # in [0, 253]; lifted where the least byte is at least the lift
        lift = grid if max(((low + carry) >> 23) - fmt.emax, 0) >= grid else 0
        multiplier = _bits.from_bits((254 + lift + fmt.emax - biased) << 23)
        return multiplier, (biased - fmt.emax).to(torch.uint8), None, lift > 0
    if scheme.family == "nvfp4":
        inv, scale_bytes, lifted = _nvfp4_block_scales_on_host(
            amax_bits, None, nvfp4, inverses, lifted_inverses
        )
        return inv, scale_bytes, None, lifted
    raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")


def _element_codes(xf, multiplier, poisoned, scheme, fmt, random):
    """The codes of the flushed float32 `xf` (packed for float4): each element times its
    group's multiplier, flushed, clamped to ±max, rounded; code 0 in poisoned groups."""
    v = _bits.ftz(xf * _groups.expand(multiplier, scheme, tuple(xf.shape)))
    codes = _encode_elements(v, fmt, random, poisoned, scheme)
    return _layouts.pack_fp4(codes) if fmt.name == "float4_e2m1fn" else codes


def _element_codes_on_host(
    xf, absb, multiplier, poisoned, scheme, fmt, random, scratch, out, lifted=False
) -> None:
    """`_element_codes` of an eager CPU slab, written into `out` (the slab's part of the
    codes), every element-sized intermediate in a reused `scratch` buffer, and the work
    that changes no code left out: the flush of the products (a float32 subnormal rounds
    to the signed zero its flush gives, in every element format and either rounding) and
    the poison mask where no group is poisoned (a host read of the flags).

    float8 and float6 to nearest are the clamped product cast by torch (float6 through
    a float8 carrier); the other element steps
    (`_encode.nearest_codes_on_host`, `_rounding.stochastic_codes_on_host`) take the
    product's magnitude |x| * m, made from `absb` (|x| patterns of `xf`, or None), and
    the sign of x, and clamp the magnitude's pattern themselves. `lifted`: the
    multiplier already carries stochastic rounding's 2**K (`_rounding.grid_exponent`).
    """
    shape = tuple(xf.shape)
    # None: no group is poisoned. Their elements become +0.0: code 0 under either rounding
    if poisoned is not None and bool(poisoned.any()):
        xf = _bits.from_bits(_bits.bits(xf) & ~_poison_mask(poisoned, scheme, shape))
        absb = None
    packed = fmt.name == "float4_e2m1fn"
    codes = scratch.take("unpacked", torch.uint8, shape) if packed else out
    if random is None and _encode.cast_on_host(fmt):
        v = _multiply_on_host(xf, multiplier, scheme, scratch.take("v", torch.float32, shape))
        v.clamp_(-fmt.max, fmt.max)
        _encode.float8_codes_on_host(v, fmt, scratch, codes)
    else:
        if absb is None:
            absb = scratch.take("absb", torch.int32, shape)
            torch.bitwise_and(_bits.bits(xf), _bits.ABS, out=absb)
        magnitude = scratch.take("v", torch.float32, shape)
        if random is not None and not lifted:
            scaled = _grid_multiplier(multiplier, fmt)
            multiplier, lifted = (multiplier, False) if scaled is None else (scaled, True)
        _multiply_on_host(absb.view(torch.float32), multiplier, scheme, magnitude)
        if random is None:
            _encode.nearest_codes_on_host(magnitude, _bits.bits(xf), fmt, scratch, codes)
        else:
            _rounding.stochastic_codes_on_host(
                magnitude, _bits.bits(xf), fmt, random, scratch, codes, lifted
            )
    if packed:
        _layouts.pack_fp4_on_host(codes, scratch, out)


def _grid_multiplier(multiplier: torch.Tensor, fmt) -> torch.Tensor | None:
    """Each group's multiplier times 2**K (`_rounding.grid_exponent`), where all of
    them stay finite (a host read), else None: stochastic rounding then takes the
    products |x| * m * 2**K, a pass over the slab fewer than scaling |x| * m by 2**K."""
    factor = 2.0 ** _rounding.grid_exponent(fmt)
    if multiplier.numel() == 0 or not float(torch.amax(multiplier)) * factor <= _bits.FLT_MAX:
        return None
    return multiplier * factor  # exact: a power of two, no overflow


def _multiply_on_host(xf, multiplier, scheme, out) -> torch.Tensor:
    """`out` = each element of `xf` times its group's multiplier (float32, one product
    rounded once), in the split view where the slab holds whole tiles."""
    shape = tuple(xf.shape)
    grid, full, padded = extend.group_broadcast(shape, scheme)
    if tuple(padded) == shape:
        torch.mul(xf.reshape(full), multiplier.reshape(grid), out=out.view(full))
    else:
        torch.mul(xf, _groups.expand(multiplier, scheme, shape), out=out)
    return out


def _in_slabs(t: torch.Tensor) -> bool:
    """Whether `quantize` cuts `t` into slabs: an eager call on a plain CPU tensor.
    Compiled, traced or transformed calls keep the whole-tensor ops, one graph."""
    return (
        t.device.type == "cpu"
        and type(t) in (torch.Tensor, torch.nn.Parameter)
        and not _storage.traced(t)
        and not torch.jit.is_tracing()
        and not torch._C._functorch.is_functorch_wrapped_tensor(t)
        # make_fx and other dispatch-mode tracers see plain CPU tensors: the slabs' data-
        # dependent skips would be baked into their graphs
        and torch.utils._python_dispatch._get_current_dispatch_mode() is None
    )


def _in_slabs_of(rows, plan, fmt, random, check_finite: bool, name: str, shape: tuple):
    """(codes, stored scale, NVFP4's global step) of `rows` (the input viewed as
    `plan.shape`, on the CPU, eager), a slab at a time, with the bytes of the
    whole-tensor ops; the work that changes no code is left out, as the reference
    leaves it out. The float family's input is not flushed: its multiplier is at most
    fmt.max / EPS, which leaves a float32 subnormal far below every format's smallest
    subnormal (the same signed zero, flushed or not); MX and NVFP4 slabs are flushed
    where they hold a subnormal. Group maxima are flushed instead (flushing is monotone
    on |x| patterns). Where groups span every slab, their scales are made once."""
    scheme, row_size, slabs = plan.scheme, plan.row_size, plan.slabs
    amax_bits = scales = nvfp4 = None  # scales: (multiplier, stored, poisoned) of all groups
    constant_lifted = False  # whether scales' multiplier carries 2**grid
    if check_finite:
        parts = ((start * row_size, rows[start:stop].to(torch.float32)) for start, stop in slabs)
        _check_finite(parts, shape, name)
    blocks_in_slabs = scheme.tiles(len(plan.shape))[0] is not None
    if plan.amax_first and scheme.family == "nvfp4" and blocks_in_slabs:
        # Only the global scale needs every slab: the tensor's amax, one vectorized pass
        # (the max of the blocks' maxima); the blocks' own are taken slab by slab.
        tensor_amax = _flushed_max(_amax_over_slabs(rows, plan, whole_tensor=True))
        nvfp4 = _nvfp4_global(tensor_amax.reshape(1), scheme, rows.device)
    elif plan.amax_first:
        amax_bits = _flushed_max(_amax_over_slabs(rows, plan))
    if scheme.family == "nvfp4" and nvfp4 is None:
        nvfp4 = _nvfp4_global(amax_bits, scheme, rows.device)
    inverses = None if nvfp4 is None else _nvfp4_inverses(nvfp4)
    # stochastic rounding takes |x| * m * 2**grid where the scale step can lift m
    grid = 0 if random is None else _rounding.grid_exponent(fmt)
    lifted_inverses = None if inverses is None or not grid else _lifted_inverses(inverses, grid)
    if amax_bits is not None and scheme.tiles(len(plan.shape))[0] is None:
        scales = _group_scales(amax_bits, scheme, fmt, nvfp4)
        scaled = _grid_multiplier(scales[0], fmt) if grid else None
        scales = scales if scaled is None else (scaled, *scales[1:])
        constant_lifted = scaled is not None
    packed = fmt.name == "float4_e2m1fn"
    last = plan.shape[-1] // 2 if packed else plan.shape[-1]
    codes = torch.empty(plan.shape[:-1] + (last,), dtype=torch.uint8)
    if scales is not None:
        scale = scales[1]
    else:
        scale_dtype = torch.float32 if scheme.family == "float" else torch.uint8
        scale = torch.empty(scheme.scale_shape(plan.shape), dtype=scale_dtype)
    scratch = _scratch.Scratch()
    for start, stop in slabs:
        groups = plan.groups(start, stop)
        xf = _float32_slab(rows[start:stop], scratch)
        absb = None
        if scheme.family != "float" or amax_bits is None:
            absb = scratch.take("absb", torch.int32, tuple(xf.shape))
            torch.bitwise_and(_bits.bits(xf), _bits.ABS, out=absb)
        flushed = scheme.family != "float" and _has_subnormal(absb)
        if flushed:
            xf = _bits.ftz(xf)
        if scales is not None:
            (multiplier, _, poisoned), lifted = scales, constant_lifted
        else:
            if amax_bits is not None:
                slab_amax = amax_bits[groups]
            else:
                slab_amax = _groups.group_max(absb, scheme)
            multiplier, scale[groups], poisoned, lifted = _group_scales_on_host(
                slab_amax, scheme, fmt, nvfp4, (inverses, lifted_inverses), grid
            )
        slab_random = None if random is None else random(start * row_size, tuple(xf.shape))
        if packed and len(plan.shape) == 1:  # two elements a byte along the axis cut
            out = codes[start // 2 : stop // 2]
        else:
            out = codes[start:stop]
        absb = None if flushed else absb  # |x| of the unflushed slab: remade from xf
        _element_codes_on_host(
            xf, absb, multiplier, poisoned, scheme, fmt, slab_random, scratch, out, lifted
        )
    return codes, scale, nvfp4


def _float32_slab(part: torch.Tensor, scratch: _scratch.Scratch) -> torch.Tensor:
    """A slab of the input as float32: itself where it is float32 already, else widened
    (exactly) into a reused buffer."""
    if part.dtype == torch.float32:
        return part
    widened = scratch.take("x", torch.float32, tuple(part.shape))
    widened.copy_(part)
    return widened


def _amax_over_slabs(rows, plan, whole_tensor: bool = False) -> torch.Tensor:
    """The |x| pattern maxima (int32) of the groups of `rows`, which span its slabs (or
    NVFP4's global scale needs them all), taken a slab at a time; with `whole_tensor`,
    the tensor's (0-d). One group (a tensor scale) is read with one `torch.aminmax` over
    the whole input in its dtype, a vectorized pass that makes no temporary (so no
    slabs, and none of their per-slab ops): max(|min|, |max|) is the max of |x|
    (widening to float32 is exact and monotone), and a NaN anywhere makes both NaN
    (torch's min and max propagate it)."""
    scheme = plan.scheme
    shape = () if whole_tensor else scheme.scale_shape(plan.shape)
    amax_bits = torch.zeros(shape, dtype=torch.int32)
    if amax_bits.numel() == 1:
        if rows.numel():
            ends = torch.stack(torch.aminmax(rows)).to(torch.float32)
            amax_bits.copy_(_bits.abs_bits(ends).amax().reshape(shape))
        return amax_bits
    for start, stop in plan.slabs:
        part_rows = rows[start:stop]
        slab_amax = _groups.group_max(_bits.abs_bits(part_rows.to(torch.float32)), scheme)
        part = amax_bits[... if whole_tensor else plan.groups(start, stop)]
        torch.maximum(part, slab_amax, out=part)
    return amax_bits


def _flushed_max(amax_bits: torch.Tensor, on_host: bool = False) -> torch.Tensor:
    """Group maxima of |x| patterns as those of the flushed input: 0 for a subnormal.
    `on_host` (CPU, eager): themselves where none is subnormal (the least, read back)."""
    if on_host and (amax_bits.numel() == 0 or int(torch.amin(amax_bits)) > _bits.MANT_MASK):
        return amax_bits
    return torch.where(amax_bits <= _bits.MANT_MASK, 0, amax_bits)


def _has_subnormal(absb: torch.Tensor) -> bool:
    """Whether any |x| pattern is a float32 subnormal (a host read). The least pattern
    answers unless it is 0; then (absb - 1) wraps 0 to -1, cleared to the largest
    pattern, so that only subnormals fall below MANT_MASK."""
    if absb.numel() == 0:
        return False
    least = int(torch.amin(absb))
    if least != 0:
        return least <= _bits.MANT_MASK
    return bool(torch.amin((absb - 1) & _bits.ABS) < _bits.MANT_MASK)


def _nvfp4_global(block_amax_bits: torch.Tensor | None, scheme, device):
    """(S_enc, S_dec, tensor poisoned) of spec §3.3 as 0-d tensors on `device`, without
    a branch on data, from the blocks' |x| maxima (the tensor's is their max)."""
    one = torch.ones((), dtype=torch.float32, device=device)
    if not scheme.global_scale:
        return one, one, torch.zeros((), dtype=torch.bool, device=device)
    assert block_amax_bits is not None
    tensor_amax_bits = _groups.group_max(block_amax_bits, _WHOLE_TENSOR)
    tensor_poisoned = tensor_amax_bits >= _bits.INF_BITS  # a non-finite tensor poisons every block
    trivial = tensor_poisoned | (tensor_amax_bits == 0)  # both give S_enc = S_dec = 1
    tensor_amax = _bits.from_bits(torch.where(trivial, _bits.bits(one), tensor_amax_bits))
    s_enc = torch.where(trivial, one, _bits.div_rn32(2688.0, tensor_amax))  # min(., FLT_MAX) inside
    s_dec = torch.where(trivial, one, _bits.ftz(_bits.div_rn32(1.0, s_enc)))
    return s_enc, s_dec, tensor_poisoned


def _nvfp4_block_scales(block_amax_bits, block_poisoned, nvfp4):
    """Transformer Engine's NVFP4 block step (spec §3.3), with lowp's poisoning (§6):
    (the encode multiplier 1/p, the stored e4m3 byte, poisoned) of each block."""
    s_enc, s_dec, tensor_poisoned = nvfp4
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
    scale_bytes = torch.where(block_poisoned, _E4M3.nan_codes[0], sb.to(torch.int32))
    return inv, scale_bytes.to(torch.uint8), block_poisoned


def _nvfp4_inverses(nvfp4) -> torch.Tensor:
    """(256,) float32: the encode multiplier 1/p of `_nvfp4_block_scales` for each e4m3
    byte sb a block can store (p = ftz(value(sb) * S_dec)): an eager CPU call reads
    each block's from here instead of repeating the block step's dozen ops."""
    every_byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    p = _bits.ftz(_encode.decode(every_byte, _E4M3) * nvfp4[1])
    p_is_zero = _bits.abs_bits(p) == 0
    safe_p = torch.where(p_is_zero, 1.0, p)
    return torch.where(p_is_zero, _bits.FLT_MAX, _bits.div_rn32(1.0, safe_p))


def _nvfp4_block_scales_on_host(
    block_amax_bits, block_poisoned, nvfp4, inverses, lifted_inverses=None
):
    """`_nvfp4_block_scales` of an eager CPU slab: the same bytes and multipliers, 1/p
    read from `inverses` by each block's byte, the selects only where a block is
    poisoned. The product amax * k is not flushed: a float32 subnormal encodes to
    byte 0, as its flush does. With `block_poisoned` None (the caller read that no
    block is, nor the tensor), the third item is instead whether 1/p comes lifted by
    2**grid from `lifted_inverses` (`_lifted_inverses`), which it does where every
    block's byte reaches that table's least finite one."""
    s_enc, _, tensor_poisoned = nvfp4
    k = s_enc * _ONE_SIXTH
    # amax*k may overflow to Inf: the min bounds it.
    sb_value = torch.clamp(_bits.from_bits(block_amax_bits) * k, max=448.0)
    sb = _encode.encode(sb_value, _E4M3)
    index = sb.reshape(-1).to(torch.int32)
    if block_poisoned is None:  # the caller read that none is, the tensor's flag included
        # lifted 1/p where the least byte's is finite (1/p falls as the byte grows)
        lifted = lifted_inverses is not None and int(torch.amin(index)) >= lifted_inverses[1]
        table = lifted_inverses[0] if lifted else inverses
        return torch.index_select(table, 0, index).reshape(sb.shape), sb, lifted
    inv = torch.index_select(inverses, 0, index).reshape(sb.shape)
    block_poisoned = block_poisoned | tensor_poisoned
    if not bool(block_poisoned.any()):
        return inv, sb, block_poisoned
    scale_bytes = torch.where(block_poisoned, _E4M3.nan_codes[0], sb.to(torch.int32))
    return inv, scale_bytes.to(torch.uint8), block_poisoned


def _lifted_inverses(inverses: torch.Tensor, grid: int) -> tuple[torch.Tensor, int]:
    """(`inverses` times 2**grid, the least e4m3 byte whose lifted 1/p is finite): the
    lifted table is exact from that byte up (1/p falls as the byte grows, p = 0 at
    byte 0 giving FLT_MAX), and a slab whose blocks' bytes all reach it reads its
    stochastic rounding's multipliers from there (`_group_scales_on_host`)."""
    lifted = inverses * 2.0**grid
    finite = (lifted <= _bits.FLT_MAX)[:0x7F]  # the bytes a block stores (<= 448)
    first = int(torch.argmax(finite.to(torch.uint8))) if bool(finite.any()) else 0x7F
    if not bool(finite[first:].all()):
        raise AssertionError("NVFP4's 1/p does not fall with the e4m3 byte")
    return lifted, first


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
