"""A weight sharded along its first axis, quantized where it lies and gathered as codes
and scales (FSDP-style), with the bytes `lowp.quantize` gives the whole weight.

Each device quantizes its rows; groups inside a shard (rows of an AxisScaling along the
last axis, MX blocks of the last axis, blocks of rows a shard holds whole) need nothing
from the others. Groups that span every shard (TensorScaling; AxisScaling along the
first axis: columns) take the whole tensor's amax: a `lax.pmax` of the shards' |x| bit
patterns, the key `lowp.quantize` takes its maximum on (NaN and Inf included), which
the shard quantizes with one extra row holding it. A block of rows that two shards
would split is refused, naming the array, the shard's rows and the block.

`quantize_gathered(local, scheme, axis_name)` runs inside `jax.shard_map` (a training
step written per device); `all_gather_quantized(w, scheme, mesh, axis)` wraps it for a
global array sharded over a mesh axis. `shard_quantized(q, mesh, axis)` places a whole
QArray (loaded from an interchange file, saved on any mesh) sharded on another.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lowp
from lowp import extend
from lowp_jax import _bits, _qarray, _quantize


def _check_shardable(scheme: lowp.Scheme, name: str) -> None:
    """ValueError naming the array for a scheme this module does not quantize shard by
    shard: NVFP4, whose global scale is the whole weight's amax."""
    if scheme.family == "nvfp4":
        raise ValueError(f"{name}: NVFP4's global scale is not gathered shard by shard yet")


def quantize_shard(local, scheme: lowp.Scheme, axis_name: str, *, name: str = "weight"):
    """Inside `shard_map` over `axis_name`: this device's rows of a weight sharded along
    axis 0, quantized as the whole weight would be. Its codes (and row-group scales) are
    this shard's part of `lowp.quantize`'s; scales of groups that span shards are the
    whole weight's, the same on every device."""
    _check_shardable(scheme, name)
    if local.ndim != 2:
        raise ValueError(f"{name}: a sharded weight must be 2-D, got shape {local.shape}")
    try:
        rows_local = extend.shard_groups(scheme, 0, local.shape[0]) is not None
    except ValueError as e:
        raise ValueError(
            f"{name}: {e} (over {lax.axis_size(axis_name)} devices of {axis_name!r}); "
            "shard so each device's rows hold whole blocks"
        ) from e
    if rows_local:
        return _quantize.quantize(local, scheme, name=name)
    absb = _bits.bits(local.astype(jnp.float32)) & _bits.ABS
    columns = scheme.tiles(2)[1] is not None  # AxisScaling along axis 0: a max per column
    amax = absb.max(axis=0) if columns else absb.max()
    amax = lax.pmax(amax, axis_name)
    amax_row = jnp.broadcast_to(_bits.from_bits(amax).astype(local.dtype), (1, local.shape[1]))
    q = _quantize.quantize(jnp.concatenate([local, amax_row]), scheme, name=name)
    return _qarray.QArray(
        q.codes[:-1], q.scale, None, scheme, tuple(local.shape), q.hp_dtype, q.scale_layout
    )


def quantize_gathered(local, scheme: lowp.Scheme, axis_name: str, *, name: str = "weight"):
    """Inside `shard_map` over `axis_name`: the whole weight's QArray, every device's
    shard quantized (`quantize_shard`) and all-gathered as codes and scales."""
    q = quantize_shard(local, scheme, axis_name, name=name)
    codes = lax.all_gather(q.codes, axis_name, axis=0, tiled=True)
    row_groups = extend.shard_groups(scheme, 0, local.shape[0]) is not None
    scale = lax.all_gather(q.scale, axis_name, axis=0, tiled=True) if row_groups else q.scale
    shape = (codes.shape[0], local.shape[1])
    return _qarray.QArray(codes, scale, None, scheme, shape, q.hp_dtype, q.scale_layout)


def all_gather_quantized(w, scheme: lowp.Scheme, mesh, axis: str, *, name: str = "weight"):
    """`w` (N, K), sharded along N over `mesh`'s `axis`, quantized shard by shard and
    gathered as codes and scales: a QArray, replicated, with the bytes of
    `lowp_jax.quantize(w, scheme)`."""
    _check_shardable(scheme, name)

    def per_device(local):
        return quantize_gathered(local, scheme, axis, name=name)

    return jax.shard_map(
        per_device, mesh=mesh, in_specs=P(axis, None), out_specs=P(), check_vma=False
    )(w)


def shard_quantized(q: _qarray.QArray, mesh, axis: str, *, name: str = "weight") -> _qarray.QArray:
    """`q` (N, K), whole (as loaded from an interchange file), placed on `mesh` with its
    rows split over `axis`: each device holds its rows' codes, and its row groups'
    scales where the groups lie inside a shard; scales of groups that span the shards
    are replicated. The bytes are q's: a checkpoint saved from any mesh (or from one
    device) loads onto another this way, and `all_gather_quantized`-style gathers of
    it give `lowp.quantize`'s bytes back.

    Raises ValueError naming the array where N does not split evenly or a shard would
    cut a block of rows (`lowp.extend.shard_groups`)."""
    _check_shardable(q.scheme, name)
    if len(q.shape) != 2 or q.scale_layout != "plain":
        raise ValueError(
            f"{name}: shard_quantized takes a 2-D QArray with plain scales, got shape "
            f"{q.shape}, scale_layout {q.scale_layout!r}"
        )
    devices = mesh.shape[axis]
    rows, rest = divmod(q.shape[0], devices)
    if rest:
        raise ValueError(
            f"{name}: {q.shape[0]} rows do not split evenly over the {devices} devices of {axis!r}"
        )
    try:
        rows_local = extend.shard_groups(q.scheme, 0, rows) is not None
    except ValueError as e:
        raise ValueError(f"{name}: {e} (over {devices} devices of {axis!r})") from e
    by_rows = NamedSharding(mesh, P(axis, None))
    codes = jax.device_put(q.codes, by_rows)
    scale = jax.device_put(q.scale, by_rows if rows_local else NamedSharding(mesh, P()))
    return _qarray.QArray(codes, scale, None, q.scheme, q.shape, q.hp_dtype, q.scale_layout)
