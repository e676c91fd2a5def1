"""Triton kernels for the fp8 casts of spec §3.1 (tensor, axis) and §3.2 (MX).

Each kernel reads the high-precision tensor in its own dtype (float32, bfloat16 or
float16; the conversion to float32 is exact) and writes uint8 codes and the scales.
They compute what `lowp/_quantize.py` computes, with the operations spec §0 allows:

- every max, flush, exponent and power of two is integer arithmetic on float32 bits
  (`_ftz`, `_abs_bits`, `_flush_max`, `_mx_scale`), or an instruction that states its
  flush (`_mul_ftz`), so hardware that flushes subnormals cannot change a byte;
- the two divisions of the float scales, `max / max(amax, EPS)` and `1 / m`, are
  `tl.math.div_rn`, the correctly rounded divide: Triton's `/` on float32 is an
  approximate one (spec §0.4);
- the only other float operation is one product, `x * m` (or `x * 2^(127-s)`) of the
  flushed x, whose result is flushed, clamped and encoded: no add follows a product,
  so FMA contraction has nothing to contract (on the GPU it is `mul.rn.ftz.f32`);
- poisoned groups (NaN/Inf, spec §6) are replaced by +0 first, and the element is
  flushed and clamped to ±max, so the encoder only ever sees finite in-range values
  (on the native path the instructions below flush and clamp: `.ftz`, `.satfinite`).
  For those, the native round-to-nearest-even conversion
  (`cvt.rn.satfinite.e4m3x2/e5m2x2.f32`, which Triton 3.6 emits on sm_90+; on sm_89 it
  rounds to f16 first, so there `NATIVE` is off) is exactly E_fmt of spec §2, and it
  does the clamp and the flush itself: `.satfinite` turns a finite |v| > max into ±max
  (the clamp to ±max, since max is representable), and a float32 subnormal lies below
  half the smallest fp8 subnormal (2^-17 for e5m2), so it rounds to the zero of its
  sign, as the flush does. The native `_encode` is therefore a product, a select and
  the cast: three operations an element where the integer path takes a dozen (the
  casts are close to instruction-bound on the H200). The Triton CPU interpreter's
  emulation of that cast is not round-to-nearest-even (it rounds ties up and drops
  the carry into the exponent), so under the interpreter the kernels use
  `_encode_bits`, the integer encoder of spec §2, after an explicit flush and clamp:
  `NATIVE` (see `_triton_casts._native`).

Shapes are viewed as (outer, R, C) with C contiguous: groups along C are "rows"
(AxisScaling / MXScaling along the last axis), groups along R are "columns" (along
any other axis; C is then the product of the dims after it). Offsets are int64: a
tensor may have more than 2**31 elements.
"""

import triton
import triton.language as tl

# Globals a kernel reads must be tl.constexpr.
_EXP_MASK = tl.constexpr(0x7F800000)
_ABS_MASK = tl.constexpr(0x7FFFFFFF)
_SIGN = tl.constexpr(-2147483648)  # 0x80000000 as an int32
_NAN_F32 = tl.constexpr(0x7FC00000)
_EPS_BITS = tl.constexpr(0x2B8CBCCC)  # float32(1e-12), the float scales' amax floor (§3.1)
_MIN_NORMAL_BITS = tl.constexpr(0x00800000)  # the smallest normal float32, 2^-126


@triton.jit
def _ftz(v):
    """Subnormal float32 -> zero of the same sign, by a bit test (spec §0.2)."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where((b & _EXP_MASK) == 0, b & _SIGN, b)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _abs_bits(x):
    """|x| as int32 patterns: an exact, NaN-aware max key. x is not flushed: the max of
    flushed values is the flushed max, so each group flushes its max once
    (`_flush_max`) instead of every element being flushed for it."""
    return x.to(tl.int32, bitcast=True) & _ABS_MASK


@triton.jit
def _flush_max(amax_bits):
    """A group's max |x| pattern, flushed: a subnormal max becomes 0 (spec §0.2)."""
    return tl.where(amax_bits < _MIN_NORMAL_BITS, 0, amax_bits)


@triton.jit
def _load(ptr, offsets, mask):
    """float32 x, as stored (not flushed); masked lanes read 0 (neutral for a max of
    |x| bits, and encoded nowhere)."""
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _mul_ftz(x, multiplier):
    """ftz(ftz(x) * multiplier) in one instruction: PTX `mul.rn.ftz.f32` flushes a
    subnormal operand or result to the zero of its sign (`.rn`: correctly rounded,
    and never contracted into an FMA)."""
    return tl.inline_asm_elementwise(
        "mul.rn.ftz.f32 $0, $1, $2;",
        "=f,f,f",
        [x, tl.broadcast_to(multiplier, x.shape)],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _float_scale(amax_bits, FMT_MAX: tl.constexpr, POW2: tl.constexpr):
    """(m, stored scale d, poisoned) of spec §3.1 for group amax patterns (any shape)."""
    poisoned = amax_bits >= _EXP_MASK
    # A poisoned group's amax counts as 0; max(amax, EPS) on bits is exact, and it
    # flushes a subnormal amax too (EPS is normal).
    safe = tl.where(poisoned, _EPS_BITS, tl.maximum(amax_bits, _EPS_BITS))
    m = tl.math.div_rn(
        tl.zeros_like(safe).to(tl.float32) + FMT_MAX, safe.to(tl.float32, bitcast=True)
    )
    if POW2:  # round down to a power of two by clearing the mantissa
        m = (m.to(tl.int32, bitcast=True) & _EXP_MASK).to(tl.float32, bitcast=True)
    d = tl.math.div_rn(tl.zeros_like(m) + 1.0, m)
    scale = tl.where(poisoned, _NAN_F32, d.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
    return m, scale, poisoned


@triton.jit
def _mx_scale(amax_bits, MODE: tl.constexpr, EMAX: tl.constexpr, MAX_MANTISSA: tl.constexpr):
    """(multiplier 2^(127-s), e8m0 byte s, poisoned) of spec §3.2; MODE 0 floor, 1 ceil, 2 rceil."""
    poisoned = amax_bits >= _EXP_MASK
    a = tl.where(poisoned, 0, _flush_max(amax_bits))
    exponent = (a >> 23) & 0xFF
    mantissa = a & 0x7FFFFF
    if MODE == 1:
        exponent += (mantissa != 0).to(tl.int32)
    elif MODE == 2:
        exponent += (mantissa > MAX_MANTISSA).to(tl.int32)
    s = tl.maximum(exponent - EMAX, 0)
    # 2^(127 - s), normal for s <= 253; 1 in a poisoned group, as in the reference.
    multiplier = ((254 - tl.where(poisoned, 127, s)) << 23).to(tl.float32, bitcast=True)
    return multiplier, tl.where(poisoned, 255, s), poisoned


@triton.jit
def _encode_bits(v, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """E_fmt of spec §2 in integer ops (`lowp.encode`): finite |v| <= max."""
    b = v.to(tl.int32, bitcast=True)
    sign = (b >> 31) & 1
    e32 = (b >> 23) & 0xFF
    mantissa = b & 0x7FFFFF
    sig = tl.where(e32 > 0, mantissa | 0x800000, mantissa)
    target = tl.maximum(e32, 1) - 127 + BIAS
    field = tl.maximum(target, 1)
    shift = tl.minimum(23 - MBITS + (field - target), 25)
    one = tl.full(shift.shape, 1, tl.int32)
    kept = sig >> shift
    rest = sig & ((one << shift) - 1)
    half = one << (shift - 1)
    up = (rest > half) | ((rest == half) & ((kept & 1) == 1))
    magnitude = ((field - 1) << MBITS) + kept + up.to(tl.int32)
    return ((sign << (EBITS + MBITS)) | magnitude).to(tl.uint8)


@triton.jit
def _encode(
    x,
    multiplier,
    poisoned,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """uint8 codes of ftz(ftz(x) * multiplier), clamped to ±max; code 0 where poisoned.
    NATIVE: the cast's saturation and rounding do the clamp and the flush (module
    docstring)."""
    if NATIVE:
        v = tl.where(poisoned, 0.0, _mul_ftz(x, multiplier))
        if EBITS == 5:
            c = v.to(tl.float8e5, fp_downcast_rounding="rtne")
        else:
            c = v.to(tl.float8e4nv, fp_downcast_rounding="rtne")
        return c.to(tl.uint8, bitcast=True)
    v = tl.where(poisoned, 0.0, _ftz(_ftz(x) * multiplier))
    v = tl.minimum(tl.maximum(v, -FMT_MAX), FMT_MAX)
    return _encode_bits(v, EBITS, MBITS, BIAS)


# --- TensorScaling: an amax pass, then a cast pass -------------------------------------


@triton.jit
def tensor_amax_kernel(x_ptr, amax_ptr, n, TILES: tl.constexpr, BLOCK: tl.constexpr):
    """amax_ptr[0] = max(amax_ptr[0], max |x| bits over this program's TILES tiles).

    Loop bounds here are constexpr: the Triton interpreter (3.6, NumPy 2) cannot take
    a runtime scalar as a `range` bound."""
    start = tl.program_id(0).to(tl.int64) * (TILES * BLOCK)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(TILES):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        absb = _abs_bits(_load(x_ptr, offsets, offsets < n))
        acc = tl.maximum(acc, absb)
    tl.atomic_max(amax_ptr, tl.max(acc, axis=0))


@triton.jit
def tensor_cast_kernel(
    x_ptr,
    amax_ptr,
    codes_ptr,
    scale_ptr,
    n,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Codes of BLOCK elements with the tensor's scale; program 0 stores the scale."""
    pid = tl.program_id(0)
    m, scale, poisoned = _float_scale(tl.load(amax_ptr), FMT_MAX, POW2)
    tl.store(scale_ptr, scale, mask=pid == 0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = _load(x_ptr, offsets, mask)
    codes = _encode(x, m, poisoned, FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
    tl.store(codes_ptr + offsets, codes, mask=mask)


# --- AxisScaling along the last axis: one read when a row fits a tile ------------------


@triton.jit
def axis_rows_kernel(
    x_ptr,
    codes_ptr,
    scale_ptr,
    rows,
    cols,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """BLOCK_M rows, each its own group. CHUNKS == 1 (cols <= BLOCK_K): the rows stay
    in registers between the amax and the cast; else they are read twice, in CHUNKS
    chunks of BLOCK_K (the second read mostly from L2). CHUNKS is constexpr for the
    interpreter's sake (see `tensor_amax_kernel`)."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = r < rows
    base = r[:, None] * cols
    k = tl.arange(0, BLOCK_K)[None, :]
    if CHUNKS == 1:
        mask = row_mask[:, None] & (k < cols)
        x = _load(x_ptr, base + k, mask)
        absb = _abs_bits(x)
        m, scale, poisoned = _float_scale(tl.max(absb, axis=1), FMT_MAX, POW2)
        codes = _encode(x, m[:, None], poisoned[:, None], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
        tl.store(codes_ptr + base + k, codes, mask=mask)
    else:
        amax = tl.zeros([BLOCK_M], tl.int32)
        for i in range(CHUNKS):
            k0 = i * BLOCK_K
            absb = _abs_bits(_load(x_ptr, base + k0 + k, row_mask[:, None] & (k0 + k < cols)))
            amax = tl.maximum(amax, tl.max(absb, axis=1))
        m, scale, poisoned = _float_scale(amax, FMT_MAX, POW2)
        for i in range(CHUNKS):
            k0 = i * BLOCK_K
            mask = row_mask[:, None] & (k0 + k < cols)
            x = _load(x_ptr, base + k0 + k, mask)
            codes = _encode(x, m[:, None], poisoned[:, None], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
            tl.store(codes_ptr + base + k0 + k, codes, mask=mask)
    tl.store(scale_ptr + r, scale, mask=row_mask)


# --- 2-D tiles of (outer, R, C): column groups, and both orientations at once ----------


@triton.jit
def _tile(pid, tiles_r, tiles_c):
    """(outer index, tile row, tile column) of program `pid`, tiles row-major (the host
    gives an empty R or C one tile, so tiles_r and tiles_c are never 0)."""
    o = pid // (tiles_r * tiles_c)
    return o.to(tl.int64), (pid // tiles_c) % tiles_r, pid % tiles_c


@triton.jit
def _span(tile, BLOCK: tl.constexpr):
    """The int64 indices of tile number `tile` along one dim."""
    return tile.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def _col_offsets(o, r, c, R, C, COLS_T: tl.constexpr):
    """Where the column codes of elements (o, r, c) go: in place, (outer, R, C), or
    with COLS_T transposed, (outer, C, R). The transposed codes are what a backward
    GEMM takes (the wgrad's x.T and dy.T, the dgrad's w.T, each K-major): written so
    here, they need no transposing copy (Triton stages the tile through shared memory
    to keep the stores coalesced)."""
    if COLS_T:
        return o * R * C + c * R + r
    return o * R * C + r * C + c


@triton.jit
def axis_amax_2d_kernel(
    x_ptr,
    row_amax_ptr,
    col_amax_ptr,
    R,
    C,
    tiles_r,
    tiles_c,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROW_TILES: tl.constexpr,
):
    """Atomic max of |x| bits into the row maxima (outer, R) and/or the column maxima
    (outer, C), both zero-initialised int32. A program covers ROW_TILES tiles down
    the columns and keeps their column maxima in registers: one atomic per column per
    ROW_TILES * BLOCK_R rows (tiles_r counts such stacks)."""
    o, tr, tc = _tile(tl.program_id(0), tiles_r, tiles_c)
    c = _span(tc, BLOCK_C)
    col_mask = c < C
    col_max = tl.zeros([BLOCK_C], tl.int32)
    for i in range(ROW_TILES):
        r = _span(tr * ROW_TILES + i, BLOCK_R)
        mask = (r < R)[:, None] & col_mask[None, :]
        absb = _abs_bits(_load(x_ptr, o * R * C + r[:, None] * C + c[None, :], mask))
        if ROWS:
            tl.atomic_max(row_amax_ptr + o * R + r, tl.max(absb, axis=1), mask=r < R)
        if COLS:
            col_max = tl.maximum(col_max, tl.max(absb, axis=0))
    if COLS:
        tl.atomic_max(col_amax_ptr + o * C + c, col_max, mask=col_mask)


@triton.jit
def axis_cast_2d_kernel(
    x_ptr,
    row_amax_ptr,
    row_codes_ptr,
    row_scale_ptr,
    col_amax_ptr,
    col_codes_ptr,
    col_scale_ptr,
    R,
    C,
    tiles_r,
    tiles_c,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    COLS_T: tl.constexpr,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """One read of a tile, codes scaled by its rows' and/or its columns' maxima; the
    first tile of each row (column) stores that row's (column's) scale. COLS_T: the
    column codes go out transposed, (outer, C, R) (`_col_offsets`)."""
    o, tr, tc = _tile(tl.program_id(0), tiles_r, tiles_c)
    r, c = _span(tr, BLOCK_R), _span(tc, BLOCK_C)
    row_mask, col_mask = r < R, c < C
    mask = row_mask[:, None] & col_mask[None, :]
    offsets = o * R * C + r[:, None] * C + c[None, :]
    x = _load(x_ptr, offsets, mask)
    if ROWS:
        amax = tl.load(row_amax_ptr + o * R + r, mask=row_mask, other=0)
        m, scale, poisoned = _float_scale(amax, FMT_MAX, POW2)
        codes = _encode(x, m[:, None], poisoned[:, None], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
        tl.store(row_codes_ptr + offsets, codes, mask=mask)
        tl.store(row_scale_ptr + o * R + r, scale, mask=row_mask & (tc == 0))
    if COLS:
        amax = tl.load(col_amax_ptr + o * C + c, mask=col_mask, other=0)
        m, scale, poisoned = _float_scale(amax, FMT_MAX, POW2)
        codes = _encode(x, m[None, :], poisoned[None, :], FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
        col_offsets = _col_offsets(o, r[:, None], c[None, :], R, C, COLS_T)
        tl.store(col_codes_ptr + col_offsets, codes, mask=mask)
        tl.store(col_scale_ptr + o * C + c, scale, mask=col_mask & (tr == 0))


@triton.jit
def tensor_cast_2d_kernel(
    x_ptr,
    amax_ptr,
    codes_ptr,
    codes_t_ptr,
    scale_ptr,
    scale_t_ptr,
    R,
    C,
    tiles_r,
    tiles_c,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """TensorScaling codes of an (R, C) tile, from one read, stored twice: as x lies
    (R, C) and transposed (C, R) (`_col_offsets`), the second for the backward GEMMs
    that read x transposed. One scale orients both ways, so the codes are the same
    bytes; program 0 stores the scale, once for each (an op's outputs are separate
    tensors)."""
    pid = tl.program_id(0)
    o, tr, tc = _tile(pid, tiles_r, tiles_c)
    r, c = _span(tr, BLOCK_R), _span(tc, BLOCK_C)
    mask = (r < R)[:, None] & (c < C)[None, :]
    m, scale, poisoned = _float_scale(tl.load(amax_ptr), FMT_MAX, POW2)
    tl.store(scale_ptr, scale, mask=pid == 0)
    tl.store(scale_t_ptr, scale, mask=pid == 0)
    offsets = o * R * C + r[:, None] * C + c[None, :]
    codes = _encode(_load(x_ptr, offsets, mask), m, poisoned, FMT_MAX, EBITS, MBITS, BIAS, NATIVE)
    tl.store(codes_ptr + offsets, codes, mask=mask)
    tl.store(codes_t_ptr + _col_offsets(o, r[:, None], c[None, :], R, C, True), codes, mask=mask)


@triton.jit
def mx_2d_kernel(
    x_ptr,
    row_codes_ptr,
    row_scale_ptr,
    col_codes_ptr,
    col_scale_ptr,
    R,
    C,
    tiles_r,
    tiles_c,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    COLS_T: tl.constexpr,
    GROUP: tl.constexpr,
    MODE: tl.constexpr,
    EMAX: tl.constexpr,
    MAX_MANTISSA: tl.constexpr,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    NATIVE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """MX blocks of GROUP elements along C (ROWS; scales (outer, R, C/GROUP)) and/or
    along R (COLS; scales (outer, R/GROUP, C)), from one read of a tile; COLS_T as in
    `axis_cast_2d_kernel`.

    The tile is held as 4-D, (BLOCK_R / GR, GR, BLOCK_C / GC, GC) with GC = GROUP for
    row blocks and GR = GROUP for column blocks (else 1): each block is then a slice
    of one axis, its max a reduction over that axis and its scale a broadcast back,
    with no reshape (which could move data between threads). A tile holds whole
    blocks (the host makes BLOCK_C, resp. BLOCK_R, a multiple of GROUP, which divides
    C, resp. R), so masked lanes fill whole blocks of their own."""
    GR: tl.constexpr = GROUP if COLS else 1
    GC: tl.constexpr = GROUP if ROWS else 1
    o, tr, tc = _tile(tl.program_id(0), tiles_r, tiles_c)
    # Row and column index of every element, as 4-D broadcastable pieces.
    r_block = (tr.to(tl.int64) * (BLOCK_R // GR) + tl.arange(0, BLOCK_R // GR))[:, None, None, None]
    r = r_block * GR + tl.arange(0, GR)[None, :, None, None]
    c_block = (tc.to(tl.int64) * (BLOCK_C // GC) + tl.arange(0, BLOCK_C // GC))[None, None, :, None]
    c = c_block * GC + tl.arange(0, GC)[None, None, None, :]
    mask = (r < R) & (c < C)
    offsets = o * R * C + r * C + c
    x = _load(x_ptr, offsets, mask)
    absb = _abs_bits(x)
    shape: tl.constexpr = (BLOCK_R // GR, GR, BLOCK_C // GC, GC)
    if ROWS:
        mult, s, poisoned = _mx_scale(tl.max(absb, axis=3), MODE, EMAX, MAX_MANTISSA)
        codes = _encode(
            x, mult[:, :, :, None], poisoned[:, :, :, None], FMT_MAX, EBITS, MBITS, BIAS, NATIVE
        )
        tl.store(row_codes_ptr + offsets, codes, mask=mask)
        # One scale per (row, block): the first element of each block stores it.
        first = (tl.arange(0, GC) == 0)[None, None, None, :]
        scale_offsets = tl.broadcast_to(o * R * (C // GC) + r * (C // GC) + c_block, shape)
        tl.store(row_scale_ptr + scale_offsets, s[:, :, :, None].to(tl.uint8), mask=mask & first)
    if COLS:
        mult, s, poisoned = _mx_scale(tl.max(absb, axis=1), MODE, EMAX, MAX_MANTISSA)
        codes = _encode(
            x, mult[:, None, :, :], poisoned[:, None, :, :], FMT_MAX, EBITS, MBITS, BIAS, NATIVE
        )
        tl.store(col_codes_ptr + _col_offsets(o, r, c, R, C, COLS_T), codes, mask=mask)
        first = (tl.arange(0, GR) == 0)[None, :, None, None]
        scale_offsets = tl.broadcast_to(o * (R // GR) * C + r_block * C + c, shape)
        tl.store(col_scale_ptr + scale_offsets, s[:, None, :, :].to(tl.uint8), mask=mask & first)


# --- BlockScaling: one float scale a 2-D tile ------------------------------------------


@triton.jit
def block_tiles_kernel(
    x_ptr,
    codes_ptr,
    scale_ptr,
    R,
    C,
    tiles_r,
    tiles_c,
    FMT_MAX: tl.constexpr,
    EBITS: tl.constexpr,
    MBITS: tl.constexpr,
    BIAS: tl.constexpr,
    POW2: tl.constexpr,
    NATIVE: tl.constexpr,
    TILE_R: tl.constexpr,
    TILE_C: tl.constexpr,
    CHUNK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CHUNKS: tl.constexpr,
):
    """One TILE_R x TILE_C tile of (outer, R, C) a program, its scale at the program's
    index (tiles row-major, as BlockScaling's scale shape); edge tiles are partial. The
    tile is read in CHUNKS chunks of CHUNK_R rows, twice: for its amax, then for the
    codes (the second read mostly from L2). BLOCK_C is TILE_C rounded up to a power of
    two, the lanes past TILE_C masked."""
    pid = tl.program_id(0)
    o, tr, tc = _tile(pid, tiles_r, tiles_c)
    j = tl.arange(0, BLOCK_C)
    c = tc.to(tl.int64) * TILE_C + j
    col_mask = (j < TILE_C) & (c < C)
    i = tl.arange(0, CHUNK_R)
    base = o * R * C
    amax = tl.zeros([CHUNK_R, BLOCK_C], tl.int32)
    for k in range(CHUNKS):
        ii = k * CHUNK_R + i
        r = tr.to(tl.int64) * TILE_R + ii
        mask = ((ii < TILE_R) & (r < R))[:, None] & col_mask[None, :]
        amax = tl.maximum(amax, _abs_bits(_load(x_ptr, base + r[:, None] * C + c[None, :], mask)))
    m, scale, poisoned = _float_scale(tl.max(tl.max(amax, axis=1), axis=0), FMT_MAX, POW2)
    tl.store(scale_ptr + pid, scale)
    for k in range(CHUNKS):
        ii = k * CHUNK_R + i
        r = tr.to(tl.int64) * TILE_R + ii
        mask = ((ii < TILE_R) & (r < R))[:, None] & col_mask[None, :]
        offsets = base + r[:, None] * C + c[None, :]
        codes = _encode(
            _load(x_ptr, offsets, mask), m, poisoned, FMT_MAX, EBITS, MBITS, BIAS, NATIVE
        )
        tl.store(codes_ptr + offsets, codes, mask=mask)
