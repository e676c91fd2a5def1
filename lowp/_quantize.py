"""The NumPy reference: `quantize` and `dequantize`, the oracle every backend matches.

Each scale family's algorithm (`scheme.family`: float, MX, NVFP4) is written out in
one branch of `quantize` and one of `dequantize`, in the order spec §3 gives, with float32 operations that each round
once. Group handling lives in `_groups`, the element encoder in `_formats`.
"""

import contextlib
import math
from types import EllipsisType
from typing import NamedTuple

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
CHUNK_ELEMENTS = 1 << 20  # quantize's default slab: 4 MiB of float32, a few in flight


def _hp_input(x, name: str) -> tuple[np.ndarray, str]:
    """An accepted input as an array, and its dtype name; TypeError for the rest (§0.1)."""
    if isinstance(x, np.generic):  # a numpy scalar is a 0-d array
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"{name}: lowp.quantize takes a numpy array, got {type(x).__name__}; "
            "use lowp_torch / lowp_jax for framework tensors"
        )
    if x.dtype.byteorder == ">":  # else "dtype >f4 is not float32": it is, byte-swapped
        raise TypeError(
            f"{name}: a big-endian array ({x.dtype.str}); lowp reads little-endian bit "
            "patterns: convert it with x.astype(x.dtype.newbyteorder('<'))"
        )
    if x.dtype == np.float64:
        raise TypeError(
            f"{name}: float64 input is refused (float64 -> float32 -> float8 rounds twice); "
            "cast to float32 first if that is what you mean"
        )
    for hp_dtype, dtype in _NUMPY_DTYPES.items():
        if x.dtype == dtype:
            return x, hp_dtype
    raise TypeError(f"{name}: input dtype {x.dtype} is not float32, bfloat16 or float16")


def _random_source(x: np.ndarray, rounding, random_bits, seed, offset, name) -> str:
    """Which random bits stochastic rounding consumes ("none", "seed", "bits"), checked."""
    source = _rounding.random_source(rounding, random_bits, seed, offset == 0, name)
    if source == "seed":
        _rounding.check_seed(seed, offset)
    if source != "bits":
        return source
    if not isinstance(random_bits, np.ndarray) or random_bits.dtype != np.uint32:
        raise TypeError(
            f"{name}: random_bits must be a uint32 numpy array, got {random_bits!r:.80}"
        )
    if random_bits.shape != x.shape:
        raise ValueError(
            f"{name}: random_bits has shape {random_bits.shape}, the input {x.shape}; one per element"
        )
    return source


class SlabPlan(NamedTuple):
    """How `quantize` cuts an input into slabs of rows (`slab_plan`); the torch frontend
    cuts its eager CPU calls the same way (`lowp.extend.slab_plan`)."""

    shape: tuple[int, ...]  # the shape the slabs cut: the input's, or its leading dims merged
    scheme: _schemes.Scheme  # the scheme that groups `shape` as the given one groups the input
    slabs: list[tuple[int, int]]  # row ranges along axis 0: whole groups, whole float4 bytes
    amax_first: bool  # a group spans every slab (or NVFP4's global scale): amax over all first

    @property
    def row_size(self) -> int:
        """Elements a row of `shape`: a slab from row `start` begins at flat index
        `start * row_size` of the input (stochastic rounding's bits follow it)."""
        return math.prod(self.shape[1:])

    def groups(self, start: int, stop: int) -> slice | EllipsisType:
        """The scales of rows `start:stop`: a slice along axis 0 of the plain scale
        shape of `shape`, or all of them (`...`) where a group spans axis 0."""
        return _groups.slab_groups(start, stop, self.scheme, len(self.shape))


def slab_plan(
    shape: tuple[int, ...],
    scheme: _schemes.Scheme,
    chunk_elements: int,
    *,
    contiguous: bool = True,
    name: str = "input",
) -> SlabPlan:
    """Slabs of about `chunk_elements` elements (at least one row, or one row of groups)
    for quantizing an input of `shape` (which `scheme` admits) a slab at a time.

    Leading dims merge into one (a 0-d input is one element) where the scheme groups the
    merged shape alike and the input is `contiguous` (the merge is then a view), so a
    rank-3 expert stack is cut as finely as a matrix. `check_chunk_elements` first.
    """
    check_chunk_elements(chunk_elements, name)
    shape, rows_scheme = tuple(int(n) for n in shape), scheme
    new: tuple[int, ...] | None = None
    if not shape:
        new = (1,)
    elif len(shape) > 2:
        new = (math.prod(shape[:-1]), shape[-1])
    if new is not None and contiguous:
        merged = scheme.reshaped(shape, new)
        if merged is not None:
            shape, rows_scheme = new, merged
    if 0 in shape[1:]:  # no element: one slab, however many empty rows a shape claims
        slabs = [(0, shape[0])]
    else:
        slabs = _groups.slabs(shape, rows_scheme, chunk_elements)
    if _formats.element_format(scheme.fmt).name == "float4_e2m1fn" and len(shape) == 1:
        slabs = _whole_bytes(slabs)
    nvfp4_global = scheme.family == "nvfp4" and scheme.global_scale  # type: ignore[union-attr]
    amax_first = rows_scheme.tiles(len(shape))[0] is None or bool(nvfp4_global)
    return SlabPlan(shape, rows_scheme, slabs, amax_first)


def check_chunk_elements(chunk_elements, name: str = "input") -> None:
    """TypeError / ValueError naming `name` unless `chunk_elements` is a positive int."""
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int):
        raise TypeError(f"{name}: chunk_elements must be an int, got {chunk_elements!r:.80}")
    if chunk_elements < 1:
        raise ValueError(f"{name}: chunk_elements must be positive, got {chunk_elements}")


def _whole_bytes(slabs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`slabs` of a 1-D packed input merged across every odd cut, so that no slab
    splits a byte of two float4 codes (merging adjacent slabs cuts no group either)."""
    merged = [slabs[0]]
    for start, stop in slabs[1:]:
        if merged[-1][1] % 2:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def _abs_bits(rows: np.ndarray) -> np.ndarray:
    """|x| as uint32 patterns of float32 (`_bits.abs_bits`) for a slab of any input dtype."""
    return _bits.abs_bits(np.ascontiguousarray(rows, dtype=np.float32))


def _max_abs_bits(rows: np.ndarray) -> np.uint32:
    """The largest |x| pattern of a slab (0 if empty): for float32, from its least and
    greatest value (two reductions that read it and write nothing; either is NaN where
    any element is, and a NaN's pattern is above every other), else of `_abs_bits`."""
    if rows.size == 0:
        return np.uint32(0)
    if rows.dtype != np.float32:
        return np.max(_abs_bits(rows))
    ends = np.array([np.min(rows), np.max(rows)], np.float32)
    return np.max(_bits.abs_bits(ends))


def _flushed_group_max(absb: np.ndarray, scheme: _schemes.Scheme) -> np.ndarray:
    """The amax bits of each group of ftz(x): flushing is monotone on |x| patterns, so
    the max of the unflushed patterns, flushed."""
    amax = _groups.group_max(absb, scheme)
    return np.where(amax <= _bits.MANT_MASK, np.uint32(0), amax)


def _non_finite_error(x: np.ndarray, rows: np.ndarray, slabs, name: str) -> FloatingPointError:
    """check_finite's error: the count of non-finite elements and the first, a slab a time."""
    count, first = 0, None
    for start, stop in slabs:
        bad = _abs_bits(rows[start:stop]).reshape(-1)
        hits = bad >= _bits.INF_BITS
        if first is None and hits.any():
            at = int(np.argmax(hits))
            first = (start * math.prod(rows.shape[1:]) + at, _bits.from_bits(bad[at] | 0))
        count += int(hits.sum())
    assert first is not None
    index = np.unravel_index(first[0], x.shape)
    return FloatingPointError(
        f"{name}: {count} non-finite element(s), the first at index "
        f"{tuple(int(i) for i in index)} (|x| = {first[1]}); check_finite=True refuses to quantize"
    )


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
    chunk_elements: int = CHUNK_ELEMENTS,
) -> _qtensor.QTensor:
    """Quantize `x` with `scheme`; the bit-exact reference of spec §3–§6.

    The work goes a slab of rows at a time, slabs that hold whole groups, so memory
    beyond the output stays a few slabs (groups spanning every row, and NVFP4's global
    scale, take a first pass over the slabs for their amax). The bytes do not depend on
    the slab size: stochastic rounding's bits are a function of each element's index.

    Args:
      x: float32, bfloat16 (ml_dtypes) or float16 array of any shape the scheme admits.
      scheme: a lowp scheme (`lowp.extend.SCHEME_TYPES`).
      rounding: "nearest" (ties to even) or "stochastic" (spec §4).
      random_bits: uint32 array shaped like `x`, for stochastic rounding.
      seed, offset: instead of random_bits, draw them with `lowp.random_bits`.
      check_finite: raise FloatingPointError on NaN/Inf instead of poisoning the group.
      name: how errors refer to `x` (a parameter name, say).
      chunk_elements: about how many elements a slab holds (at least one row, or one
        row of groups); changes memory and speed, never the result.

    Returns:
      A QTensor with the plain scale layout.

    >>> import lowp
    >>> q = lowp.quantize(np.array([1.0, -2.0, 448.0], np.float32), lowp.TensorScaling())
    >>> q.codes.tolist(), float(q.scale)
    ([56, 192, 126], 1.0)
    """
    _schemes.check_scheme(scheme)
    x, hp_dtype = _hp_input(x, name)
    shape = x.shape
    scheme.check_shape(shape)
    source = _random_source(x, rounding, random_bits, seed, offset, name)
    fmt = _formats.element_format(scheme.fmt)
    plan = slab_plan(shape, scheme, chunk_elements, contiguous=x.flags.c_contiguous, name=name)
    rows, row_scheme, slabs = x.reshape(plan.shape), plan.scheme, plan.slabs
    random_rows = None if random_bits is None else np.reshape(random_bits, rows.shape)
    packed = fmt.name == "float4_e2m1fn"
    row_size = plan.row_size

    # Groups that span axis 0, and NVFP4's global scale, need every slab's amax first;
    # where NVFP4's blocks lie within slabs, only the tensor's (the max of the blocks').
    amax_bits = None
    nvfp4 = None
    if plan.amax_first and scheme.family == "nvfp4" and row_scheme.tiles(rows.ndim)[0]:
        tensor_amax = np.uint32(0)
        for start, stop in slabs:
            tensor_amax = max(tensor_amax, _max_abs_bits(rows[start:stop]))
        tensor_amax = np.uint32(0) if tensor_amax <= _bits.MANT_MASK else tensor_amax
        nvfp4 = _nvfp4_global(np.asarray(tensor_amax), scheme)
    elif plan.amax_first:
        amax_bits = np.zeros(row_scheme.scale_shape(rows.shape), np.uint32)
        for start, stop in slabs:
            part = amax_bits[plan.groups(start, stop)]
            np.maximum(part, _groups.group_max(_abs_bits(rows[start:stop]), row_scheme), out=part)
        amax_bits = np.where(amax_bits <= _bits.MANT_MASK, np.uint32(0), amax_bits)
    if scheme.family == "nvfp4" and nvfp4 is None:
        nvfp4 = _nvfp4_global(amax_bits, scheme)

    codes = np.empty(rows.shape[:-1] + (rows.shape[-1] // 2,) if packed else rows.shape, np.uint8)
    scale_dtype = np.float32 if scheme.family == "float" else np.uint8
    scale = np.empty(row_scheme.scale_shape(rows.shape), scale_dtype)
    scratch = _rounding.Scratch()
    for start, stop in slabs:
        groups = plan.groups(start, stop)
        xf = np.ascontiguousarray(rows[start:stop], dtype=np.float32)
        absb = None if amax_bits is not None and scheme.family == "float" else _bits.abs_bits(xf)
        if amax_bits is not None:
            slab_amax = amax_bits[groups]
        else:
            slab_amax = _flushed_group_max(absb, row_scheme)  # type: ignore[arg-type]
        poisoned = slab_amax >= _bits.INF_BITS
        if check_finite and poisoned.any():
            raise _non_finite_error(x, rows, slabs, name)
        if nvfp4 is not None and nvfp4.poisoned:
            poisoned = np.ones_like(poisoned)
        owned = not np.may_share_memory(xf, x)
        flush = absb if scheme.family != "float" else None
        xf = _finite_input(xf, flush, poisoned, row_scheme, owned)
        amax = _bits.from_bits(np.where(poisoned, np.uint32(0), slab_amax))

        if scheme.family == "float":
            multiplier, d = float_scales(amax, fmt, scheme.pow2)  # type: ignore[union-attr]
            scale[groups] = np.where(poisoned, _bits.from_bits(_bits.NAN_F32), d)
        elif scheme.family == "mx":
            s = mx_scale_bytes(slab_amax, fmt, scheme.mode)  # type: ignore[union-attr]
            s = np.where(poisoned, np.uint8(0xFF), s)
            # 2**(127 - s) is a normal float32 for every finite-group byte s in [0, 253].
            multiplier = _bits.pow2(127 - np.where(poisoned, 127, s.astype(np.int64)))
            scale[groups] = s
        elif nvfp4 is not None:
            multiplier, scale[groups] = _nvfp4_block_scales(nvfp4, amax, poisoned)
        else:
            raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

        # NVFP4's x * inv may overflow (inv = FLT_MAX where p is 0): the clamp bounds it.
        with np.errstate(over="ignore") if nvfp4 is not None else contextlib.nullcontext():
            v = _groups.multiply(xf, multiplier, row_scheme)
        np.clip(v, -np.float32(fmt.max), np.float32(fmt.max), out=v)
        random = None
        if source == "seed":
            first = offset + start * row_size
            random = _rounding.random_bits_from(int(seed), int(first), v.size, scratch)  # type: ignore[arg-type]
            random = random.reshape(v.shape)
        elif source == "bits":
            random = random_rows[start:stop]  # type: ignore[index]
        slab_codes = _rounding.round_elements(v, fmt, random, scratch)
        if not packed:
            codes[start:stop] = slab_codes
        elif rows.ndim == 1:  # two elements a byte along the one axis the slabs cut
            codes[start // 2 : stop // 2] = _layouts.pack_checked_fp4(slab_codes)
        else:
            codes[start:stop] = _layouts.pack_checked_fp4(slab_codes)

    global_scale = None
    if nvfp4 is not None and scheme.global_scale:  # type: ignore[union-attr]
        stored = _bits.from_bits(_bits.NAN_F32) if nvfp4.poisoned else nvfp4.s_dec
        global_scale = np.asarray(stored, dtype=np.float32).reshape(())
    return _qtensor.QTensor(
        codes=codes.reshape(shape[:-1] + codes.shape[-1:] if shape else ()),
        scale=scale.reshape(scheme.scale_shape(shape)),
        global_scale=global_scale,
        scheme=scheme,
        shape=tuple(int(n) for n in shape),
        hp_dtype=hp_dtype,
    )


def _finite_input(xf, absb, poisoned, scheme, owned: bool) -> np.ndarray:
    """A slab ready to scale: elements of poisoned groups zeroed (so that no NaN, and
    no signalling NaN, reaches an arithmetic op: they encode to code 0) and, where their
    |x| patterns `absb` are given (the MX and NVFP4 families), float32 subnormals
    flushed (spec §0.2): those scales may be large enough to make a subnormal count. The float family's multiplier is at
    most fmt.max / EPS, which leaves a subnormal far below every format's smallest
    subnormal, so it rounds to the same signed zero flushed or not. Copies before
    writing unless `owned`."""
    if poisoned.any():
        xf = xf if owned else xf.copy()
        owned = True
        np.copyto(xf, np.float32(0), where=_groups.expand(poisoned, scheme, xf.shape))
    if absb is not None and ((absb - np.uint32(1)) < _bits.MANT_MASK).any():  # 0 wraps
        xf = _bits.ftz(xf)
    return xf


class _Nvfp4Global(NamedTuple):
    """NVFP4's per-tensor step (spec §3.3): S_enc, S_dec, and whether a non-finite tensor
    poisons every block."""

    s_enc: np.float32
    s_dec: np.float32
    poisoned: bool


def _nvfp4_global(block_amax_bits: np.ndarray | None, scheme) -> _Nvfp4Global:
    """From the tensor amax, the max of the block amaxes; (1, 1) without a global scale."""
    one = np.float32(1)
    if not scheme.global_scale:
        return _Nvfp4Global(one, one, False)
    assert block_amax_bits is not None
    tensor_amax_bits = np.max(block_amax_bits, initial=0)
    if tensor_amax_bits >= _bits.INF_BITS:
        return _Nvfp4Global(one, one, True)
    if tensor_amax_bits == 0:
        return _Nvfp4Global(one, one, False)
    tensor_amax = _bits.from_bits(np.asarray(tensor_amax_bits, np.uint32))
    with np.errstate(over="ignore"):
        s_enc = np.minimum(
            np.divide(np.float32(2688), tensor_amax, dtype=np.float32), _bits.FLT_MAX
        )
    s_dec = _bits.ftz(np.divide(one, s_enc, dtype=np.float32))
    return _Nvfp4Global(np.float32(s_enc), np.float32(s_dec), False)


def _nvfp4_block_scales(
    tensor: _Nvfp4Global, block_amax: np.ndarray, block_poisoned: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(the encode multiplier 1/p, the stored e4m3 byte) of each block: Transformer
    Engine's formula (spec §3.3), with lowp's poisoning (§6)."""
    one = np.float32(1)
    k = np.multiply(tensor.s_enc, np.divide(one, np.float32(6), dtype=np.float32), dtype=np.float32)
    with np.errstate(over="ignore"):  # amax*k may overflow: the min bounds it
        sb_value = np.minimum(
            _bits.ftz(np.multiply(block_amax, k, dtype=np.float32)), np.float32(448)
        )
    sb = _formats.encode_in_range(sb_value, _E4M3)
    p = _bits.ftz(np.multiply(_formats.decode(sb, _E4M3), tensor.s_dec, dtype=np.float32))
    safe_p = np.where(p == 0, one, p)
    inv = np.where(
        p == 0, _bits.FLT_MAX, np.minimum(np.divide(one, safe_p, dtype=np.float32), _bits.FLT_MAX)
    )
    stored = np.where(block_poisoned, np.uint8(_E4M3.nan_codes[0]), sb).astype(np.uint8)
    return inv.astype(np.float32), stored


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


def dequantize(
    q: _qtensor.QTensor, out_dtype: str | None = None, *, chunk_elements: int = CHUNK_ELEMENTS
) -> np.ndarray:
    """The values `q` stands for, as `out_dtype` (default: the dtype it was quantized from).

    Poisoned groups give the canonical NaN of `out_dtype`; everything else is
    `RN_out(ftz(RN32(value(code) * scale)))` per spec §3. The work goes a slab of rows at
    a time, cut as `quantize` cuts them, so memory beyond the output stays a few slabs.

    Args:
      q: a QTensor from `quantize` or `load`.
      out_dtype: "float32", "bfloat16", "float16" or None.
      chunk_elements: about how many elements a slab holds; never changes the result.
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
    packed = fmt.name == "float4_e2m1fn"
    plan = slab_plan(q.shape, scheme, chunk_elements, contiguous=q.codes.flags.c_contiguous)
    rows_scheme, scale_shape = plan.scheme, plan.scheme.scale_shape(plan.shape)
    codes = q.codes.reshape(plan.shape[:-1] + (plan.shape[-1] // 2 if packed else plan.shape[-1],))
    scale = np.reshape(_plain_scale(q), scale_shape)
    poisoned = np.reshape(poisoned_groups(q), scale_shape)
    s_dec = np.float32(1) if q.global_scale is None else _bits.ftz(q.global_scale)
    out = np.empty(plan.shape, _NUMPY_DTYPES[out_dtype])
    for start, stop in plan.slabs:
        groups = plan.groups(start, stop)
        if packed and len(plan.shape) == 1:  # two elements a byte along the axis cut
            slab_codes = _layouts.unpack_fp4(codes[start // 2 : stop // 2])
        elif packed:
            slab_codes = _layouts.unpack_fp4(codes[start:stop])
        else:
            slab_codes = codes[start:stop]
        out[start:stop] = _dequantize_slab(
            _formats.decode(slab_codes, fmt),
            scale[groups],
            poisoned[groups],
            s_dec,
            rows_scheme,
            out_dtype,
        )
    return out.reshape(q.shape)


def _dequantize_slab(values, scale, poisoned, s_dec, scheme, out_dtype: str) -> np.ndarray:
    """`dequantize`'s arithmetic on the decoded values of a slab whose groups' stored
    scales are `scale` (plain layout), poisoned where `poisoned` says."""
    shape = values.shape
    # A finite input near FLT_MAX can dequantize to +-Inf where the scale rounded up
    # (pow2, MX ceil/rceil): IEEE rounding of the product, documented, not warned about.
    with np.errstate(over="ignore", invalid="ignore"):
        # A stored float32 scale is an input of the product: flushed (spec §0.2), which
        # matters only for a hand-made one (quantize's are >= EPS / max, normal).
        if scheme.family == "float":
            scale = _bits.ftz(np.asarray(scale, np.float32))
            out = np.multiply(values, _groups.expand(scale, scheme, shape), dtype=np.float32)
        elif scheme.family == "mx":
            exponent = np.where(scale == 0xFF, 127, scale.astype(np.int64)) - 127
            out = _bits.mul_pow2(values, _groups.expand(exponent, scheme, shape))
        elif scheme.family == "nvfp4":
            p = _bits.ftz(np.multiply(_formats.decode(scale, _E4M3), s_dec, dtype=np.float32))
            out = np.multiply(values, _groups.expand(p, scheme, shape), dtype=np.float32)
        else:
            raise TypeError(f"unknown scheme family {scheme.family!r} of {scheme!r}")

    out = _bits.ftz(out)
    poisoned = _groups.expand(poisoned, scheme, shape) | np.isnan(out)
    with np.errstate(over="ignore"):  # RN_out may overflow float16 to +-Inf, as IEEE says
        result = out.astype(_NUMPY_DTYPES[out_dtype])
    nan = np.array(
        _CANONICAL_NAN_BITS[out_dtype], dtype=np.uint32 if out_dtype == "float32" else np.uint16
    )
    return np.where(poisoned, nan.view(_NUMPY_DTYPES[out_dtype]), result)
