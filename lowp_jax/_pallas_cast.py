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
from lowp import _schemes
from lowp_jax import _bits, _devices

_FLOAT8 = {"float8_e4m3fn": jnp.float8_e4m3fn, "float8_e5m2": jnp.float8_e5m2}
TILE_ELEMENTS = 4096  # elements a program encodes
WARPS = 4
_MAX_TILE_COLS = 1024


# Off: every cast goes through XLA (for measuring the two side by side).
ENABLED = True


def applies(scheme: lowp.Scheme, fmt_name: str, shape: tuple[int, ...]) -> bool:
    """Whether a nearest-rounding cast of `shape` with `scheme` may take the kernel when
    lowered for CUDA: a float8 format, one scale for the tensor or per row of the last
    axis, fewer than 2**31 elements (the kernel's offsets are int32), every GPU of this
    machine sm_90+, and not inside `shard_map` (its per-device values carry types the
    kernel's output would have to repeat; XLA's cast runs there instead)."""
    if not ENABLED or fmt_name not in _FLOAT8 or not shape:
        return False
    if not 0 < math.prod(shape) < 2**31:
        return False
    if isinstance(scheme, lowp.AxisScaling):
        if (
            len(shape) < 2
            or _schemes.normalize_axis(scheme.axis, len(shape), scheme) != len(shape) - 1
        ):
            return False
    elif not isinstance(scheme, lowp.TensorScaling):
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


def _kernel(x_ref, m_ref, codes_ref, *, rows, cols, tile, per_row, native, fmt_max, dtype):
    i, j = pl.program_id(0), pl.program_id(1)
    tile_r, tile_c = tile
    r = i * tile_r + jnp.arange(tile_r)
    c = j * tile_c + jnp.arange(tile_c)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    block = (pl.ds(i * tile_r, tile_r), pl.ds(j * tile_c, tile_c))
    x = plgpu.load(x_ref.at[block], mask=mask, other=0).astype(jnp.float32)
    if per_row:
        m = plgpu.load(m_ref.at[pl.ds(i * tile_r, tile_r), pl.ds(0, 1)], mask=r[:, None] < rows)
    else:
        m = plgpu.load(m_ref.at[pl.ds(0, 1), pl.ds(0, 1)])
    v = _mul_ftz(x, m) if native else _mul_ftz_spelled(x, m, fmt_max)
    v = jnp.where(jnp.broadcast_to(jnp.isnan(m), v.shape), 0.0, v)  # a poisoned group
    plgpu.store(codes_ref.at[block], v.astype(dtype), mask=mask)


def _cast_local(x, multiplier, fmt_name: str, fmt_max: float, native: bool):
    """The kernel over x viewed as (R, C) with the multiplier as (1, 1) or (R, 1)."""
    shape = x.shape
    if x.size == 0:  # an empty shard, or an empty batch under vmap: no program to launch
        return jnp.zeros(shape, _FLOAT8[fmt_name])
    cols = shape[-1]
    x2 = x.reshape(-1, cols)
    rows = x2.shape[0]
    per_row = multiplier.size > 1
    tile = tiles(cols)
    dtype = _FLOAT8[fmt_name]
    kernel = functools.partial(
        _kernel,
        rows=rows,
        cols=cols,
        tile=tile,
        per_row=per_row,
        native=native,
        fmt_max=np.float32(fmt_max),
        dtype=dtype,
    )
    codes = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, cols), dtype),
        grid=(pl.cdiv(rows, tile[0]), pl.cdiv(cols, tile[1])),
        interpret=not native,
        compiler_params=plgpu.CompilerParams(num_warps=WARPS, num_stages=1),
        name="lowp_float8_cast",
    )(x2, multiplier.reshape(-1, 1))
    return codes.reshape(shape)


# --- sharding: the cast is elementwise, so each device casts its own shard -------------
# Without these rules XLA would gather a sharded input onto every device for the kernel.


def _specs(x_sharding, ndim: int, per_row: bool):
    """(x's spec, the multiplier's): x keeps its sharding and the multiplier follows its
    rows; a sharding with no mesh axes to name (not a NamedSharding) is replicated."""
    x_spec = tuple(x_sharding.spec) if isinstance(x_sharding, NamedSharding) else ()
    x_spec = x_spec + (None,) * (ndim - len(x_spec))
    m_spec = x_spec[:-1] + (None,) if per_row else (None,) * ndim
    return P(*x_spec), P(*m_spec)


def _infer_sharding(fmt_name, fmt_max, native, mesh, arg_shapes, result_shape):
    x = arg_shapes[0]
    x_spec, _ = _specs(x.sharding, len(x.shape), False)
    return NamedSharding(mesh, x_spec)


def _partition(fmt_name, fmt_max, native, mesh, arg_shapes, result_shape):
    x, m = arg_shapes
    x_spec, m_spec = _specs(x.sharding, len(x.shape), math.prod(m.shape) > 1)

    def lower(x, m):
        return _cast_local(x, m, fmt_name, fmt_max, native)

    shardings = (NamedSharding(mesh, x_spec), NamedSharding(mesh, m_spec))
    return mesh, lower, NamedSharding(mesh, x_spec), shardings


def _sharding_rule(fmt_name, fmt_max, native, mesh, arg_types, result_types):
    ndim = len(arg_types[0].shape)
    per_row = math.prod(arg_types[1].shape) > 1
    dims = [f"d{i}" for i in range(ndim)]
    ones = [f"one{i}" for i in range(ndim)]
    m_dims = dims[:-1] + ones[-1:] if per_row else ones
    return f"{' '.join(dims)}, {' '.join(m_dims)} -> {' '.join(dims)}"


_cast_partitioned = custom_partitioning(_cast_local, static_argnums=(2, 3, 4))
_cast_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer_sharding,
    sharding_rule=_sharding_rule,
)


def cast(x: jax.Array, multiplier: jax.Array, *, fmt_name: str, fmt_max: float, native: bool):
    """float8 codes (dtype of `fmt_name`) of `x`, rank >= 1, for a multiplier of one
    element (the tensor's) or of shape x.shape[:-1] + (1,) (each row's); a NaN
    multiplier poisons its group (code 0). Sharded inputs are cast shard by shard."""
    if multiplier.size == 1:
        multiplier = multiplier.reshape((1,) * x.ndim)
    elif multiplier.shape != x.shape[:-1] + (1,):
        raise ValueError(
            f"multiplier: shape {multiplier.shape} is neither one element nor one per row "
            f"of x {x.shape}"
        )
    return _batchable(fmt_name, float(fmt_max), native)(x, multiplier.astype(jnp.float32))


@functools.cache
def _batchable(fmt_name: str, fmt_max: float, native: bool):
    """The cast for one format, with a vmap rule (custom_partitioning has none): a batch
    of tensors is one tensor of more rows, each with its own multiplier."""

    @custom_vmap
    def run(x, multiplier):
        return _cast_partitioned(x, multiplier, fmt_name, fmt_max, native)

    @run.def_vmap
    def _(axis_size, in_batched, x, multiplier):
        x_batched, m_batched = in_batched
        if not x_batched:
            x = jnp.broadcast_to(x, (axis_size, *x.shape))
        if not m_batched:
            multiplier = jnp.broadcast_to(multiplier, (axis_size, *multiplier.shape))
        return run(x, jnp.broadcast_to(multiplier, (*x.shape[:-1], 1))), True

    return run
