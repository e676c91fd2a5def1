"""Fast fp8 casts: `lowp_torch.quantize` in a few fused Triton kernels, same bytes.

What runs here (kernels in `_triton_kernels`, each reading the high-precision tensor
in its own dtype; bytes moved per element for a bfloat16 input in brackets):

| scheme                                | kernels                                        |
|---------------------------------------|------------------------------------------------|
| TensorScaling                         | amax pass, then cast pass [2 + 2 + 1]          |
| AxisScaling along the last axis       | one pass over blocks of rows [2 + 1]           |
| AxisScaling along another axis        | amax pass, then cast pass [2 + 2 + 1]          |
| AxisScaling along the last axis of a transposed view (`transposed_source`) | the column passes of the source, codes written transposed [2 + 2 + 1] |
| MXScaling along the last axis of a transposed view | one column pass of the source [2 + 1 + 1/32 + 2/32] |
| MXScaling along any axis              | one pass [2 + 1 + 1/32]                        |
| `quantize_both`, TensorScaling        | amax pass, then one cast pass writing both [2 + 2 + 1 + 1] |
| `quantize_both`, AxisScaling          | one amax pass for rows and columns, one cast pass writing both [2 + 2 + 1 + 1] |
| `quantize_both`, MXScaling            | one pass writing both [2 + 1 + 1 + 2/32]       |
| BlockScaling 1 x b (C a multiple of b) | the AxisScaling rows pass over b-wide rows [2 + 1] |
| BlockScaling b x 1 (R a multiple of b) | AxisScaling's column passes [2 + 2 + 1]       |
| BlockScaling, other tiles             | one pass a tile, reading it twice [2 + 2 (L2) + 1] |

Element formats float8_e4m3fn and float8_e5m2, every MX mode, MX blocks that are
powers of two; nearest rounding (stochastic rounding stays on the torch-ops path).
No host sync: the tensor amax goes from one kernel to the next in device memory.
Which calls come here is `_cast_kernels`' business; this module imports triton.
"""

import contextlib
import math
import threading

import torch
import triton
from torch.library import wrap_triton

import lowp
from lowp import extend
from lowp_torch import _cast_ops, _qtensor, _storage
from lowp_torch import _triton_kernels as K

_MX_MODES = {"floor": 0, "ceil": 1, "rceil": 2}
# Tile sizes: starting points for the H200, to be tuned with `bench/casts.py --tune`.
# About 16 elements a thread keeps registers low enough (ptxas: ~80 a thread at 16,
# ~150-250 at 32) for several programs per SM, and so enough loads in flight.
_FLAT_BLOCK = 4096  # TensorScaling: elements per program
_AMAX_PROGRAMS = 4096  # TensorScaling amax: programs loop over tiles, one atomic each
_ROWS_ONE_PASS = 8192  # AxisScaling rows up to this long stay in registers: one read
_ROWS_CHUNK = 8192  # longer rows are read twice, in chunks of this many elements
# H200 tune of the rows kernel after the lean encode (`bench/casts.py --tune --rows
# rowwise`, 16384^2 bf16): 16 elements a thread, 0.196 ms, against 0.249 ms at 32.
_ROWS_ELEMENTS_PER_THREAD = 16
_TILE_ELEMENTS = 4096  # rows kernel: BLOCK_M * BLOCK_K when rows are short
_TILE = (16, 512)  # (BLOCK_R, BLOCK_C) of the MX kernel along rows, at most
_ELEMENTS_PER_THREAD = 32
# The kernels with column groups (along axis -2, and both orientations at once) reduce
# across threads and, for `quantize_both`, stage the transposed codes through shared
# memory: their tiles are tuned on their own.
# H200, `bench/casts.py --tune --rows rowwise_both,mxfp8_both`: (64, 64) tiles of 4 warps
# took rowwise_both from 1.236 to 0.600 ms and mxfp8_both from 0.821 to 0.645 ms at
# 16384^2 bf16 (the (16, 512) tile of the row kernels, before).
_TILE_COLS = (64, 64)
_COLS_ELEMENTS_PER_THREAD = 32
_AMAX_ROW_TILES = 4  # column maxima: tiles a program stacks per atomic, at most
# The amax pass of AxisScaling's column groups stores no codes, so its tile need not be
# the cast's: a wider one takes fewer row-maximum atomics a row (C / BLOCK_C of them).
# None: _TILE_COLS. On the H200 this pass (over x, w and dy) took 0.35 ms of the 0.84 ms
# of casts in a float8_rowwise 16384x4096x14336 step (bench/results/2026-11-30_f14ba58_profile_linear.txt),
# against 0.17 ms for its bytes; `bench/casts.py --tune --rows rowwise_both` tries others.
_AMAX_TILE = None
_LAUNCHES = threading.local()  # .wrapped: inside `wrapped_launches`, in this thread


def quantize(t: torch.Tensor, scheme) -> _qtensor.QuantizedTensor:
    """`lowp_torch.quantize(t, scheme)` with nearest rounding, by the Triton kernels.

    The caller (`_cast_kernels.use_triton`) has checked that `t` is a float32,
    bfloat16 or float16 tensor on a Triton device (or under the Triton interpreter),
    that its shape suits `scheme`, and that `scheme` is one of those above.
    """
    fmt = extend.element_format(scheme.fmt)
    source = transposed_source(t, scheme)
    if source is not None:  # t = source.transpose(-2, -1): no transposing copy
        shape = tuple(t.shape)
        if _storage.traced(source):
            op = _cast_ops.traced_op("triton_quantize_transposed")
            codes, scale = op(source, _cast_ops.scheme_key(scheme))
        else:
            with _on_device(source):
                codes, scale = _launch_transposed(source, scheme, fmt)
        return _wrap(codes, scale, scheme, shape, t.dtype, fmt)
    x = t.detach().contiguous()
    shape = tuple(x.shape)
    if _storage.traced(x):  # torch.compile: the same launches, as an op (`_cast_ops`)
        op = _cast_ops.traced_op("triton_quantize")
        codes, scale = op(x, _cast_ops.scheme_key(scheme))
    else:
        with _on_device(x):
            codes, scale = _launch(x, shape, scheme, fmt)
    return _wrap(codes, scale, scheme, shape, t.dtype, fmt)


def transposed_source(t: torch.Tensor, scheme) -> torch.Tensor | None:
    """The contiguous tensor whose `transpose(-2, -1)` `t` is, where `scheme` groups t's
    last axis (AxisScaling, MXScaling): `quantize` then reads it along its axis -2 and
    writes t's codes contiguous (`_launch_transposed`), without first copying t into
    its own layout (the dgrad's w.T of a stacked weight (E, N, K): a strided copy as
    long as the cast itself). None for any other t or scheme."""
    if t.dim() < 2 or t.is_contiguous():
        return None
    if not isinstance(scheme, (lowp.AxisScaling, lowp.MXScaling)):
        return None
    if extend.normalize_axis(scheme.axis, t.dim(), scheme) != t.dim() - 1:
        return None
    source = t.detach().transpose(-2, -1)
    return source if source.is_contiguous() else None


def _launch_transposed(source, scheme, fmt):
    """(uint8 codes, flat scales) of source.transpose(-2, -1) quantized along its last
    axis, from source (..., R, C) contiguous: source's column groups, the codes written
    transposed (..., C, R) by the column kernels (COLS_T). MX scales come out (outer,
    R / block, C) and are transposed to the plain layout here (1/block of the bytes)."""
    shape = tuple(source.shape)
    view = (math.prod(shape[:-2]), shape[-2], shape[-1])
    if isinstance(scheme, lowp.AxisScaling):
        return _axis_2d(source, view, fmt, scheme.pow2, rows=False, cols=True, cols_t=True)[1]
    if isinstance(scheme, lowp.MXScaling):
        codes, scale = _mx_2d(source, view, scheme, fmt, rows=False, cols=True, cols_t=True)[1]
        outer, r, c = view
        scale = scale.reshape(outer, r // scheme.block, c).transpose(1, 2).reshape(-1)
        return codes, scale
    raise TypeError(f"no transposed Triton cast for {scheme!r}")


def _launch(x, shape, scheme, fmt):
    """(uint8 codes, flat scales) of `quantize`, one branch per scheme."""
    if isinstance(scheme, lowp.TensorScaling):
        return _tensor(x, fmt, scheme.pow2)
    if isinstance(scheme, lowp.BlockScaling):
        return _block(x, shape, scheme, fmt)
    outer, r, c = _grouped_view(shape, scheme.axis)
    # c == 1: each group is a contiguous run of r elements, a row (the grouped axis is
    # the last, or only size-1 dims follow it); else groups run down columns of c.
    if isinstance(scheme, lowp.AxisScaling):
        if c == 1:
            return _axis_rows(x, outer, r, fmt, scheme.pow2)
        return _axis_2d(x, (outer, r, c), fmt, scheme.pow2, rows=False, cols=True)[1]
    if isinstance(scheme, lowp.MXScaling):
        if c == 1:
            return _mx_2d(x, (1, outer, r), scheme, fmt, rows=True, cols=False)[0]
        return _mx_2d(x, (outer, r, c), scheme, fmt, rows=False, cols=True)[1]
    raise TypeError(f"no Triton cast for {scheme!r}")


def quantize_both(t: torch.Tensor, scheme):
    """Both orientations of a 2-D `t` from one read: (quantize(t, scheme),
    quantize(t, scheme.permuted((1, 0)))), for TensorScaling and for AxisScaling and
    MXScaling along axis -1 (permuted: along axis -2; TensorScaling's one scale does not
    care, and its second codes are the first's, written transposed).

    The training backward needs each operand scaled along both of its axes (spec §8):
    x along K (forward) and M (wgrad), w along K and N (dgrad), dy along N (dgrad) and
    M (wgrad). The second result is what `lowp_torch._training._transposed` views
    transposed. Same preconditions as `quantize`, plus `t.dim() == 2`.

    The training layer calls it (`_training._quantize_and_keep`) where both GEMMs of a
    tensor take the same scheme and `_cast_kernels.use_triton` admits t with it and
    with it along axis -2 (float8_rowwise's and mxfp8's x, w and dy; mxfp8_gw_hp's w;
    float8_tensorwise's x, w and dy, whose backward would otherwise copy the codes
    transposed), and keeps the second result for the backward instead of t. Its H200
    bandwidth against two `quantize` calls is `bench/casts.py`'s to measure.
    """
    if not isinstance(scheme, (lowp.TensorScaling, lowp.AxisScaling, lowp.MXScaling)):
        raise TypeError(
            f"quantize_both takes TensorScaling, AxisScaling or MXScaling, got {scheme!r}"
        )
    along_last = isinstance(scheme, lowp.TensorScaling) or (
        t.dim() == 2 and extend.normalize_axis(scheme.axis, 2, scheme) == 1
    )
    if t.dim() != 2 or not along_last:
        raise ValueError(
            f"quantize_both takes a 2-D tensor and a scheme along its last axis; got shape "
            f"{tuple(t.shape)} and {scheme}"
        )
    x = t.detach().contiguous()
    shape = tuple(x.shape)
    fmt = extend.element_format(scheme.fmt)
    if _storage.traced(x):  # torch.compile: the same launches, as an op (`_cast_ops`)
        op = _cast_ops.traced_op("triton_quantize_both")
        row_codes, row_scale, col_codes, col_scale = op(x, _cast_ops.scheme_key(scheme))
    else:
        with _on_device(x):
            (row_codes, row_scale), (col_codes, col_scale) = _launch_both(x, scheme, fmt)
    return (
        _wrap(row_codes, row_scale, scheme, shape, t.dtype, fmt),
        # written transposed: a (C, R) buffer seen as (R, C), so t.T's codes are contiguous
        _wrap(col_codes.t(), col_scale, scheme.permuted((1, 0)), shape, t.dtype, fmt),
    )


def _launch_both(x, scheme, fmt):
    """[(row codes, row scales), (column codes (C, R), column scales)] of a 2-D x."""
    view = (1,) + tuple(x.shape)
    if isinstance(scheme, lowp.TensorScaling):
        return _tensor_both(x, fmt, scheme.pow2)
    if isinstance(scheme, lowp.AxisScaling):
        return _axis_2d(x, view, fmt, scheme.pow2, rows=True, cols=True, cols_t=True)
    return _mx_2d(x, view, scheme, fmt, rows=True, cols=True, cols_t=True)


# --- views and wrapping ----------------------------------------------------------------


def _grouped_view(shape, axis) -> tuple[int, int, int]:
    """(outer, R, C): the dims before `axis`, `axis` itself, and the dims after it."""
    ax = axis % len(shape)
    return math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1 :])


def _wrap(codes, scale, scheme, shape, hp_dtype, fmt) -> _qtensor.QuantizedTensor:
    """A QuantizedTensor of uint8 codes (shape `shape`) and flat scales."""
    scale = scale.reshape(scheme.scale_shape(shape))
    if isinstance(scheme, lowp.MXScaling):
        scale = _storage.as_stored(scale, torch.float8_e8m0fnu)
    return _qtensor.QuantizedTensor(
        codes=_storage.as_stored(codes.reshape(shape), _storage.CODE_DTYPES[fmt.name]),
        scale=scale,
        global_scale=None,
        scheme=scheme,
        shape=shape,
        hp_dtype=hp_dtype,
    )


def _on_device(x):
    """Launch on x's GPU (Triton launches on the current device), or anywhere for
    the interpreter's CPU tensors."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _native(x) -> bool:
    """Whether the kernels may use Triton's fp8 conversion (see `_triton_kernels`): on
    sm_90+ only, where Triton 3.6 emits the direct `cvt.rn.satfinite.*.f32`. On sm_89 it
    goes through `cvt.rz.f16.f32` first (a second rounding: half the ties of a sweep came
    out wrong when that PTX was simulated), below sm_89 it rounds e5m2 ties up and has no
    e4m3 at all; and the CPU interpreter's emulation is not ties-to-even. Everywhere but
    sm_90+ the kernels use the integer encoder."""
    if triton.knobs.runtime.interpret or not x.is_cuda or torch.version.hip is not None:
        return False  # ROCm: CUDA capabilities and PTX (`_mul_ftz`) do not apply
    return native_cast_exact(torch.cuda.get_device_capability(x.device))


def native_cast_exact(capability: tuple[int, int]) -> bool:
    """Whether Triton's fp8 conversion on a GPU of this compute capability is the one
    round-to-nearest-even `cvt.rn.satfinite.*.f32` (checked in the compiled PTX by the
    tests, for sm_80, sm_89 and sm_90)."""
    return tuple(capability) >= (9, 0)


def _element_args(fmt, x) -> dict:
    return {
        "FMT_MAX": fmt.max,
        "EBITS": fmt.ebits,
        "MBITS": fmt.mbits,
        "BIAS": fmt.bias,
        "NATIVE": _native(x),
    }


@contextlib.contextmanager
def wrapped_launches():
    """Inside the block (in this thread), kernels launch through `wrap_triton`: the
    bodies of `_cast_ops`' triton_ops, which torch.compile traces into launches that
    Inductor makes from its own code, and which outside a graph launch directly.
    Elsewhere a kernel launches as itself (`wrap_triton`'s eager dispatch costs host
    time, and only a triton_op's body is traced through it)."""
    before = getattr(_LAUNCHES, "wrapped", False)
    _LAUNCHES.wrapped = True
    try:
        yield
    finally:
        _LAUNCHES.wrapped = before


def _kernel(jit_function):
    """The kernel to launch: itself, or its `wrap_triton` wrapper in `wrapped_launches`."""
    return wrap_triton(jit_function) if getattr(_LAUNCHES, "wrapped", False) else jit_function


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _warps(tile_elements: int, per_thread: int | None = None) -> int:
    """Warps for a tile: per_thread elements each (default _ELEMENTS_PER_THREAD), between
    1 and 32 (a one-pass row of 16384 elements: 32 warps of 51 registers a thread,
    against 16 of 100)."""
    per_thread = per_thread or _ELEMENTS_PER_THREAD
    return min(32, max(1, tile_elements // (32 * per_thread)))


# --- launches --------------------------------------------------------------------------


def _tensor_amax(x) -> torch.Tensor:
    """The amax pass of TensorScaling: max |x| bits, an int32 of one element."""
    n = x.numel()
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    tiles = _cdiv(n, _FLAT_BLOCK)
    if tiles:
        # A power of two tiles per program: few distinct compilations.
        per_program = _pow2_at_least(_cdiv(tiles, _AMAX_PROGRAMS))
        _kernel(K.tensor_amax_kernel)[(_cdiv(tiles, per_program),)](
            x, amax, n, TILES=per_program, BLOCK=_FLAT_BLOCK, num_warps=_warps(_FLAT_BLOCK)
        )
    return amax


def _tensor(x, fmt, pow2):
    n = x.numel()
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    amax = _tensor_amax(x)
    tiles = _cdiv(n, _FLAT_BLOCK)
    # At least one program: it stores the scale, also of an empty tensor.
    _kernel(K.tensor_cast_kernel)[(max(tiles, 1),)](
        x,
        amax,
        codes,
        scale,
        n,
        POW2=pow2,
        BLOCK=_FLAT_BLOCK,
        num_warps=_warps(_FLAT_BLOCK),
        **_element_args(fmt, x),
    )
    return codes, scale


def _tensor_both(x, fmt, pow2):
    """[(codes, scale), (codes transposed (C, R), a copy of the scale)] of a 2-D x under
    TensorScaling: the amax pass, then one cast pass over 2-D tiles writing both."""
    r, c = x.shape
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    codes_t = torch.empty((c, r), dtype=torch.uint8, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    scale_t = torch.empty((), dtype=torch.float32, device=x.device)
    amax = _tensor_amax(x)
    block_r = min(_TILE_COLS[0], _pow2_at_least(r))
    block_c = min(_TILE_COLS[1], _pow2_at_least(c))
    programs, tiles_r, tiles_c = _grid_2d((1, r, c), block_r, block_c)
    _kernel(K.tensor_cast_2d_kernel)[(programs,)](
        x,
        amax,
        codes,
        codes_t,
        scale,
        scale_t,
        r,
        c,
        tiles_r,
        tiles_c,
        POW2=pow2,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=_warps(block_r * block_c, _COLS_ELEMENTS_PER_THREAD),
        **_element_args(fmt, x),
    )
    return [(codes, scale), (codes_t, scale_t)]


def _axis_rows(x, rows, cols, fmt, pow2):
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0:
        return codes, scale
    block_k = _pow2_at_least(cols) if cols <= _ROWS_ONE_PASS else _ROWS_CHUNK
    block_m = min(max(1, _TILE_ELEMENTS // block_k), _pow2_at_least(rows))
    _kernel(K.axis_rows_kernel)[(_cdiv(rows, block_m),)](
        x,
        codes,
        scale,
        rows,
        cols,
        POW2=pow2,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        CHUNKS=max(1, _cdiv(cols, block_k)),
        num_warps=_warps(block_m * block_k, _ROWS_ELEMENTS_PER_THREAD),
        **_element_args(fmt, x),
    )
    return codes, scale


def _grid_2d(view, block_r, block_c) -> tuple[int, int, int]:
    """(programs, tiles_r, tiles_c); a zero-sized R or C still gets one tile of
    masked lanes, so that the scales of its (empty) groups are stored."""
    outer, r, c = view
    tiles_r, tiles_c = max(1, _cdiv(r, block_r)), max(1, _cdiv(c, block_c))
    return outer * tiles_r * tiles_c, tiles_r, tiles_c


def _block(x, shape, scheme, fmt):
    """(codes, flat scales) of BlockScaling. Its scales are the float scales of spec §3.1
    over b0 x b1 tiles of the last two dims: a 1 x b tile is an AxisScaling group of the
    (..., R * C / b, b) view, a b x 1 tile one down the columns of (... R / b, b, C),
    where whole tiles cover the dim; other tiles (and partial edge tiles) take the tile
    kernel."""
    (b0, b1), pow2 = scheme.block, scheme.pow2
    outer, r, c = math.prod(shape[:-2]), shape[-2], shape[-1]
    if x.numel() == 0:  # then some dim is 0, and so is the scales' count
        return torch.empty(shape, dtype=torch.uint8, device=x.device), torch.empty(
            0, dtype=torch.float32, device=x.device
        )
    if b0 == 1 and c % b1 == 0:
        return _axis_rows(x, outer * r * (c // b1), b1, fmt, pow2)
    if b1 == 1 and r % b0 == 0:
        return _axis_2d(x, (outer * (r // b0), b0, c), fmt, pow2, rows=False, cols=True)[1]
    tiles_r, tiles_c = _cdiv(r, b0), _cdiv(c, b1)
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    scale = torch.empty(outer * tiles_r * tiles_c, dtype=torch.float32, device=x.device)
    block_c = _pow2_at_least(b1)
    chunk_r = min(_pow2_at_least(b0), max(1, _TILE_ELEMENTS // block_c))
    _kernel(K.block_tiles_kernel)[(outer * tiles_r * tiles_c,)](
        x,
        codes,
        scale,
        r,
        c,
        tiles_r,
        tiles_c,
        POW2=pow2,
        TILE_R=b0,
        TILE_C=b1,
        CHUNK_R=chunk_r,
        BLOCK_C=block_c,
        CHUNKS=_cdiv(b0, chunk_r),
        num_warps=_warps(chunk_r * block_c, _ROWS_ELEMENTS_PER_THREAD),
        **_element_args(fmt, x),
    )
    return codes, scale


def _axis_2d(x, view, fmt, pow2, rows: bool, cols: bool, cols_t: bool = False):
    """[(row codes, row scales) or None, (column codes, column scales) or None]; cols_t:
    the column codes transposed (`_col_codes`)."""
    outer, r, c = view
    device = x.device
    row_amax = torch.zeros(outer * r if rows else 1, dtype=torch.int32, device=device)
    col_amax = torch.zeros(outer * c if cols else 1, dtype=torch.int32, device=device)
    row_codes = torch.empty(x.shape if rows else 1, dtype=torch.uint8, device=device)
    col_codes = _col_codes(x, view, cols, cols_t)
    row_scale = torch.empty(outer * r if rows else 1, dtype=torch.float32, device=device)
    col_scale = torch.empty(outer * c if cols else 1, dtype=torch.float32, device=device)
    block_r = min(_TILE_COLS[0], _pow2_at_least(r))
    block_c = min(_TILE_COLS[1], _pow2_at_least(c))
    programs, tiles_r, tiles_c = _grid_2d(view, block_r, block_c)
    if programs:
        _axis_amax_2d(x, view, row_amax, col_amax, rows, cols)
        common = {"ROWS": rows, "COLS": cols, "BLOCK_R": block_r, "BLOCK_C": block_c}
        warps = _warps(block_r * block_c, _COLS_ELEMENTS_PER_THREAD)
        _kernel(K.axis_cast_2d_kernel)[(programs,)](
            x,
            row_amax,
            row_codes,
            row_scale,
            col_amax,
            col_codes,
            col_scale,
            r,
            c,
            tiles_r,
            tiles_c,
            POW2=pow2,
            COLS_T=cols_t,
            num_warps=warps,
            **common,
            **_element_args(fmt, x),
        )
    return [(row_codes, row_scale) if rows else None, (col_codes, col_scale) if cols else None]


def _axis_amax_2d(x, view, row_amax, col_amax, rows: bool, cols: bool) -> None:
    """The amax pass of `_axis_2d`: atomic maxima of |x| bits into the row and/or column
    maxima, in tiles of `_AMAX_TILE`, stacked `_AMAX_ROW_TILES` high for the columns."""
    _, r, c = view
    tile = _AMAX_TILE or _TILE_COLS
    block_r, block_c = min(tile[0], _pow2_at_least(r)), min(tile[1], _pow2_at_least(c))
    stack = min(_AMAX_ROW_TILES, _grid_2d(view, block_r, block_c)[1])
    stack = 1 << (stack.bit_length() - 1)  # a power of two, so the stack is a tile
    programs, tiles_r, tiles_c = _grid_2d(view, block_r * stack, block_c)
    _kernel(K.axis_amax_2d_kernel)[(programs,)](
        x,
        row_amax,
        col_amax,
        r,
        c,
        tiles_r,
        tiles_c,
        ROW_TILES=stack,
        ROWS=rows,
        COLS=cols,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=_warps(block_r * block_c, _COLS_ELEMENTS_PER_THREAD),
    )


def _col_codes(x, view, cols: bool, cols_t: bool) -> torch.Tensor:
    """The buffer of the column codes: x's shape, or transposed, (C, R) for a 2-D view
    (outer 1) and (outer, C, R) for others."""
    if not cols:
        return torch.empty(1, dtype=torch.uint8, device=x.device)
    if cols_t:
        outer, r, c = view
        shape = (c, r) if outer == 1 else (outer, c, r)
        return torch.empty(shape, dtype=torch.uint8, device=x.device)
    return torch.empty(x.shape, dtype=torch.uint8, device=x.device)


def _mx_2d(x, view, scheme, fmt, rows: bool, cols: bool, cols_t: bool = False):
    """[(row codes, row scale bytes) or None, (column codes, column scale bytes) or None];
    cols_t as in `_axis_2d`."""
    outer, r, c = view
    group = scheme.block
    device = x.device
    row_codes = torch.empty(x.shape if rows else 1, dtype=torch.uint8, device=device)
    col_codes = _col_codes(x, view, cols, cols_t)
    row_scale = torch.empty(
        outer * r * (c // group) if rows else 1, dtype=torch.uint8, device=device
    )
    col_scale = torch.empty(
        outer * (r // group) * c if cols else 1, dtype=torch.uint8, device=device
    )
    # Tiles hold whole blocks along each grouped axis (group divides that axis).
    tile, per_thread = (_TILE_COLS, _COLS_ELEMENTS_PER_THREAD) if cols else (_TILE, None)
    block_r = min(tile[0], _pow2_at_least(r))
    block_c = min(tile[1], _pow2_at_least(c))
    if cols:
        block_r = max(block_r, group)
    if rows:
        block_c = max(block_c, group)
    programs, tiles_r, tiles_c = _grid_2d(view, block_r, block_c)
    if programs and x.numel():  # no element, no group: nothing to store
        _kernel(K.mx_2d_kernel)[(programs,)](
            x,
            row_codes,
            row_scale,
            col_codes,
            col_scale,
            r,
            c,
            tiles_r,
            tiles_c,
            ROWS=rows,
            COLS=cols,
            COLS_T=cols_t,
            GROUP=group,
            MODE=_MX_MODES[scheme.mode],
            EMAX=fmt.emax,
            MAX_MANTISSA=fmt.max_mantissa,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            num_warps=_warps(block_r * block_c, per_thread),
            **_element_args(fmt, x),
        )
    return [(row_codes, row_scale) if rows else None, (col_codes, col_scale) if cols else None]
