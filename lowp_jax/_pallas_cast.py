"""The float8 element cast of the float-scaled schemes as one Pallas (Triton) kernel.

`lowp_jax.quantize` computes a group's multiplier m with XLA (exact divisions, spec
§3.1) and then encodes every element: ftz(ftz(x) * m), clamped to ±max, rounded to
float8, code 0 in a poisoned group. In XLA that is a dozen integer operations an
element and the activation cast of an fp8 dense layer is instruction-bound on an H200.
On an NVIDIA GPU of compute capability 9.0 or more this kernel does the same in three
instructions, as lowp_torch's Triton casts do (the argument is in docs/numerics.md
§0.5 and `lowp_torch/_triton_kernels.py`):

- `mul.rn.ftz.f32` (inline PTX): the correctly rounded product of the flushed operands,
  flushed; JAX's float32 product may be contracted or not flushed, this one cannot;
- a select: code 0 where the multiplier is NaN, which is how a poisoned group's
  multiplier arrives here;
- Triton's round-to-nearest-even float8 conversion, `cvt.rn.satfinite.e4m3x2/e5m2x2.f32`
  on sm_90: `.satfinite` turns a finite |v| > max into ±max (the clamp), and a flushed
  product is 0 or at least 2^-126, far below half the smallest float8 subnormal, so
  nothing else is left to flush.

Under Pallas's interpreter (CPU tests) the inline PTX cannot run: the kernel then
spells the flush, the product and the clamp out in JAX operations, and XLA's float8
convert, exact on the clamped, flushed values (see `_encode`), rounds. The tests run
that form against `lowp.quantize`; the GPU conformance run checks the PTX one.

The tensor is viewed as (R, C) with C its last axis, and the multiplier as (1, 1)
(TensorScaling) or (R, 1) (AxisScaling along the last axis). Tiles are powers of two
with masked edges, so any R and C work.

The transposed cast (`transposed=True`) is the codes of x.T for one scale per column of
x (AxisScaling along x.T's last axis, what the training backward asks of x, dy and w):
each program reads a tile of x in its own (R, C) layout with the (1, tile) multipliers
of its columns, encodes it as above and stores the tile transposed into the (C, R)
codes (Triton stages it through shared memory), so x is never copied transposed in
high precision.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental import pallas as pl
from jax.experimental.custom_partitioning import custom_partitioning
from jax.experimental.pallas import triton as plgpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lowp
from lowp import extend
from lowp_jax import _bits, _devices, _switches

_FLOAT8 = {"float8_e4m3fn": jnp.float8_e4m3fn, "float8_e5m2": jnp.float8_e5m2}
TILE_ELEMENTS = 4096  # elements a program encodes
WARPS = 4
_MAX_TILE_COLS = 1024
# (rows, cols) of x a program of the transposed cast encodes, at most: lowp_torch's
# transposed column cast took (64, 64) tiles of 4 warps on the H200
# (`lowp_torch._triton_casts._TILE_COLS`); untuned here.
TRANSPOSED_TILE = (64, 64)


# The kernels index x with int32 offsets: one launch covers fewer elements than this.
MAX_ELEMENTS = 2**31

KERNEL_MODES = ("auto", "xla")
_KERNELS = _switches.Switch(("auto", True))  # (mode, transposed): `cast_kernels`


def cast_kernels(mode: str = "auto", *, transposed: bool = True):
    """Inside the block, `lowp_jax.quantize` casts to float8 with `mode`'s kernels.

    Args:
      mode: "auto" (the default: the Pallas kernel where `applies` finds it can run,
        else XLA's operations) or "xla" (always XLA's operations, also on an sm_90+
        GPU). Both write the same bytes; "xla" is there to measure the kernel against
        them and to keep the cast fusible with what XLA computes around it.
      transposed: False keeps the row kernel but not the transposed one: a transposed
        cast (`quantize_transposed`, the training backward's rowwise operands) copies
        x.T in high precision and casts that, for measuring the transposed kernel
        against the copy.

    A context manager, as `lowp_torch.cast_kernels` is, because the casts that matter
    for speed happen inside layers and training steps a keyword cannot reach; scoped,
    so a test or a benchmark cannot leak its choice into the next. There is no mode
    forcing the kernel: it is chosen per platform when the computation is lowered
    (`lax.platform_dependent`), so a trace cannot say it will run.

    The setting is read when a computation is traced, and it is part of what jit's
    caches key on (`lowp_jax._switches`): a jitted function called under another
    setting is traced again, and one compiled inside the block keeps the block's
    setting when it runs outside. Process-wide and thread-safe as
    `lowp_torch.cast_kernels` is.

    >>> import jax.numpy as jnp, numpy as np, lowp, lowp_jax
    >>> with lowp_jax.cast_kernels("xla"):
    ...     q = lowp_jax.quantize(jnp.ones(4), lowp.TensorScaling())
    >>> np.asarray(q.codes).view(np.uint8).tolist()
    [126, 126, 126, 126]
    """
    if mode not in KERNEL_MODES:
        raise ValueError(f"cast_kernels mode must be one of {KERNEL_MODES}, got {mode!r}")
    return _KERNELS.setting((mode, bool(transposed)))


def applies(
    scheme: lowp.Scheme, fmt_name: str, shape: tuple[int, ...], *, transposed: bool = False
) -> bool:
    """Whether a nearest-rounding cast of `shape` with `scheme` may take the kernel when
    lowered for CUDA: a float8 format, one scale for the tensor or per row of the last
    axis (with `transposed`: one per column, AxisScaling along axis -2, the codes written
    transposed), fewer than 2**31 elements (the kernel's offsets are int32), every GPU
    of this machine sm_90+, and not inside `shard_map` (its per-device values carry types
    the kernel's output would have to repeat; XLA's cast runs there instead); never
    where `cast_kernels` turns it off."""
    mode, transposed_kernel = _KERNELS.value
    if mode == "xla" or (transposed and not transposed_kernel):
        return False
    if fmt_name not in _FLOAT8 or not shape:
        return False
    if not 0 < math.prod(shape) < MAX_ELEMENTS:
        return False
    if isinstance(scheme, lowp.AxisScaling):
        grouped_axis = len(shape) - (2 if transposed else 1)
        if len(shape) < 2 or extend.normalize_axis(scheme.axis, len(shape), scheme) != grouped_axis:
            return False
    elif transposed or not isinstance(scheme, lowp.TensorScaling):
        return False
    if jax.sharding.get_abstract_mesh().manual_axes:
        return False
    return _devices.sm90_gpus()


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def tiles(cols: int) -> tuple[int, int]:
    """(rows, cols) of a program's tile for rows of `cols` elements."""
    tile_c = min(_next_pow2(cols), _MAX_TILE_COLS)
    return max(TILE_ELEMENTS // tile_c, 1), tile_c


def transposed_tiles(rows: int, cols: int) -> tuple[int, int]:
    """(rows, cols) of x in a program's tile of the transposed cast of (rows, cols)."""
    return min(_next_pow2(rows), TRANSPOSED_TILE[0]), min(_next_pow2(cols), TRANSPOSED_TILE[1])


def _mul_ftz(x, m):
    (product,) = plgpu.elementwise_inline_asm(
        "mul.rn.ftz.f32 $0, $1, $2;",
        args=[x, jnp.broadcast_to(m, x.shape)],
        constraints="=f,f,f",
        pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)],
    )
    return product


def _mul_ftz_spelled(x, m, fmt_max):
    """ftz(ftz(x) * m) clamped to ±fmt_max, in JAX operations (the interpreter's form)."""
    v = _bits.ftz(_bits.ftz(x) * m)
    return jnp.clip(v, -fmt_max, fmt_max)


def _encode(x, m, *, native, fmt_max, dtype):
    """The float8 codes of a loaded tile x for its multipliers m (broadcast over the
    tile): ftz(ftz(x) * m) rounded to `dtype`, code 0 where m is NaN (a poisoned group)."""
    x = x.astype(jnp.float32)
    v = _mul_ftz(x, m) if native else _mul_ftz_spelled(x, m, fmt_max)
    v = jnp.where(jnp.broadcast_to(jnp.isnan(m), v.shape), 0.0, v)
    return v.astype(dtype)


def _kernel(x_ref, m_ref, codes_ref, *, rows, cols, tile, per_row, encode):
    i, j = pl.program_id(0), pl.program_id(1)
    tile_r, tile_c = tile
    r = i * tile_r + jnp.arange(tile_r)
    c = j * tile_c + jnp.arange(tile_c)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    block = (pl.ds(i * tile_r, tile_r), pl.ds(j * tile_c, tile_c))
    x = plgpu.load(x_ref.at[block], mask=mask, other=0)
    if per_row:
        m = plgpu.load(m_ref.at[pl.ds(i * tile_r, tile_r), pl.ds(0, 1)], mask=r[:, None] < rows)
    else:
        m = plgpu.load(m_ref.at[pl.ds(0, 1), pl.ds(0, 1)])
    plgpu.store(codes_ref.at[block], encode(x, m), mask=mask)


def _transposed_kernel(x_ref, m_ref, codes_ref, *, rows, cols, tile, encode):
    """Tile (i, j) of matrix b of x (batch, rows, cols), each column encoded with its
    multiplier (batch, 1, cols), stored transposed into the codes (batch, cols, rows)."""
    b, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    tile_r, tile_c = tile
    r = i * tile_r + jnp.arange(tile_r)
    c = j * tile_c + jnp.arange(tile_c)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    row_block, col_block = pl.ds(i * tile_r, tile_r), pl.ds(j * tile_c, tile_c)
    x = plgpu.load(x_ref.at[b, row_block, col_block], mask=mask, other=0)
    m = plgpu.load(m_ref.at[b, pl.ds(0, 1), col_block], mask=c[None, :] < cols)
    codes = encode(x, m)
    plgpu.store(codes_ref.at[b, col_block, row_block], codes.T, mask=mask.T)


def _codes_shape(shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    """The codes' shape: x's, or with `transposed` x's with its last two axes swapped."""
    return shape[:-2] + (shape[-1], shape[-2]) if transposed else shape


def _group_multiplier_shape(shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    """The multiplier's shape for one scale per row of x, or with `transposed` per column."""
    return shape[:-2] + (1, shape[-1]) if transposed else shape[:-1] + (1,)


def _cast_local(x, multiplier, fmt_name: str, fmt_max: float, native: bool, transposed: bool):
    """The kernel over x viewed as (R, C) with the multiplier as (1, 1) or (R, 1); with
    `transposed`, over x viewed as (B, R, C) with the multiplier as (B, 1, C), writing
    codes (B, C, R). A view of MAX_ELEMENTS or more (a batch under vmap, where `applies`
    saw one tensor of it) is cast in launches of whole rows (matrices) below that."""
    shape = x.shape
    dtype = _FLOAT8[fmt_name]
    if x.size == 0:  # an empty shard, or an empty batch under vmap: no program to launch
        return jnp.zeros(_codes_shape(shape, transposed), dtype)
    encode = functools.partial(_encode, native=native, fmt_max=np.float32(fmt_max), dtype=dtype)

    def call(kernel, x, multiplier, grid, codes_view, name):
        return pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct(codes_view, dtype),
            grid=grid,
            interpret=not native,
            compiler_params=plgpu.CompilerParams(num_warps=WARPS, num_stages=1),
            name=name,
        )(x, multiplier)

    if transposed:
        rows, cols = shape[-2:]
        x = x.reshape(-1, rows, cols)
        multiplier = multiplier.reshape(-1, 1, cols)
        tile = transposed_tiles(rows, cols)
        kernel = functools.partial(
            _transposed_kernel, rows=rows, cols=cols, tile=tile, encode=encode
        )

        def launch(x, multiplier):
            grid = (x.shape[0], pl.cdiv(rows, tile[0]), pl.cdiv(cols, tile[1]))
            view = (x.shape[0], cols, rows)
            return call(kernel, x, multiplier, grid, view, "lowp_float8_cast_transposed")

    else:
        cols = shape[-1]
        x = x.reshape(-1, cols)
        per_row = multiplier.size > 1
        multiplier = multiplier.reshape(-1, 1)
        tile = tiles(cols)

        def launch(x, multiplier):
            kernel = functools.partial(
                _kernel, rows=x.shape[0], cols=cols, tile=tile, per_row=per_row, encode=encode
            )
            grid = (pl.cdiv(x.shape[0], tile[0]), pl.cdiv(cols, tile[1]))
            return call(kernel, x, multiplier, grid, x.shape, "lowp_float8_cast")

    return _in_launches(launch, x, multiplier).reshape(_codes_shape(shape, transposed))


def _in_launches(launch, x, multiplier):
    """launch(x, multiplier) over slices of x's first axis of fewer than MAX_ELEMENTS
    elements each (a multiplier of one slice's worth, shape[0] == 1, is shared), the
    codes concatenated along it."""
    per_launch = max((MAX_ELEMENTS - 1) // math.prod(x.shape[1:]), 1)
    if x.shape[0] <= per_launch:
        return launch(x, multiplier)
    pieces = []
    for start in range(0, x.shape[0], per_launch):
        part = slice(start, start + per_launch)
        pieces.append(launch(x[part], multiplier if multiplier.shape[0] == 1 else multiplier[part]))
    return jnp.concatenate(pieces)


# --- sharding: the cast is elementwise, so each device casts its own shard -------------
# Without these rules XLA would gather a sharded input onto every device for the kernel.


def _specs(x_sharding, ndim: int, per_group: bool, transposed: bool):
    """(x's spec, the multiplier's, the codes'): x keeps its sharding, the multiplier
    follows its rows (with `transposed`: its columns) or is replicated (one element),
    and the codes are sharded as x (with `transposed`: its last two axes swapped). A
    sharding with no mesh axes to name (not a NamedSharding) is replicated."""
    x_spec = tuple(x_sharding.spec) if isinstance(x_sharding, NamedSharding) else ()
    x_spec = x_spec + (None,) * (ndim - len(x_spec))
    if transposed:
        lead, rows, cols = x_spec[:-2], x_spec[-2], x_spec[-1]
        return P(*x_spec), P(*lead, None, cols), P(*lead, cols, rows)
    m_spec = x_spec[:-1] + (None,) if per_group else (None,) * ndim
    return P(*x_spec), P(*m_spec), P(*x_spec)


def _infer_sharding(fmt_name, fmt_max, native, transposed, mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    *_, codes_spec = _specs(x.sharding, len(x.shape), False, transposed)
    return NamedSharding(mesh, codes_spec)


def _partition(fmt_name, fmt_max, native, transposed, mesh, arg_shapes, result_shape):
    x, m = arg_shapes
    x_spec, m_spec, codes_spec = _specs(
        x.sharding, len(x.shape), math.prod(m.shape) > 1, transposed
    )

    def lower(x, m):
        return _cast_local(x, m, fmt_name, fmt_max, native, transposed)

    shardings = (NamedSharding(mesh, x_spec), NamedSharding(mesh, m_spec))
    return mesh, lower, NamedSharding(mesh, codes_spec), shardings


def _sharding_rule(fmt_name, fmt_max, native, transposed, mesh, arg_types, result_types):
    ndim = len(arg_types[0].shape)
    dims = [f"d{i}" for i in range(ndim)]
    ones = [f"one{i}" for i in range(ndim)]
    codes_dims = dims
    if transposed:
        m_dims = dims[:-2] + [ones[-2], dims[-1]]
        codes_dims = dims[:-2] + [dims[-1], dims[-2]]
    elif math.prod(arg_types[1].shape) > 1:
        m_dims = dims[:-1] + ones[-1:]
    else:
        m_dims = ones
    return f"{' '.join(dims)}, {' '.join(m_dims)} -> {' '.join(codes_dims)}"


_cast_partitioned = custom_partitioning(_cast_local, static_argnums=(2, 3, 4, 5))
_cast_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer_sharding,
    sharding_rule=_sharding_rule,
)


def cast(
    x: jax.Array,
    multiplier: jax.Array,
    *,
    fmt_name: str,
    fmt_max: float,
    native: bool,
    transposed: bool = False,
):
    """float8 codes (dtype of `fmt_name`) of `x`, rank >= 1, for a multiplier of one
    element (the tensor's) or of shape x.shape[:-1] + (1,) (each row's); a NaN
    multiplier poisons its group (code 0). With `transposed`: the codes of x (rank >= 2)
    with its last two axes swapped, for a multiplier of shape x.shape[:-2] + (1, C), one
    per column of x (so per row of the codes). Sharded inputs are cast shard by shard."""
    if transposed:
        if x.ndim < 2 or multiplier.shape != _group_multiplier_shape(x.shape, True):
            raise ValueError(
                f"multiplier: shape {multiplier.shape} is not one per column of x {x.shape} "
                "(the transposed cast takes x of rank >= 2)"
            )
    elif multiplier.size == 1:
        multiplier = multiplier.reshape((1,) * x.ndim)
    elif multiplier.shape != _group_multiplier_shape(x.shape, False):
        raise ValueError(
            f"multiplier: shape {multiplier.shape} is neither one element nor one per row "
            f"of x {x.shape}"
        )
    run = _batchable(fmt_name, float(fmt_max), native, transposed)
    return run(x, multiplier.astype(jnp.float32))


@functools.cache
def _batchable(fmt_name: str, fmt_max: float, native: bool, transposed: bool):
    """The cast for one format, with a vmap rule (custom_partitioning has none): a batch
    of tensors is one tensor of more rows (or, transposed, more matrices), each with its
    own multipliers."""

    @custom_vmap
    def run(x, multiplier):
        return _cast_partitioned(x, multiplier, fmt_name, fmt_max, native, transposed)

    @run.def_vmap
    def _(axis_size, in_batched, x, multiplier):
        x_batched, m_batched = in_batched
        if not x_batched:
            x = jnp.broadcast_to(x, (axis_size, *x.shape))
        if not m_batched:
            multiplier = jnp.broadcast_to(multiplier, (axis_size, *multiplier.shape))
        return run(
            x, jnp.broadcast_to(multiplier, _group_multiplier_shape(x.shape, transposed))
        ), True

    return run
