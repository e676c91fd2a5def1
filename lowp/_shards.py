"""Which quantization groups stay inside a shard: the one rule that FSDP's quantized
all-gather (lowp_torch), JAX's sharded quantize (lowp_jax) and tensor parallelism's
split check (lowp_torch) all follow.

A 2-D tensor is split along one axis into equal shards of `local` elements. A scheme's
groups along that axis (`scheme.tiles(2)[axis]`) then lie

  inside a shard   groups of t elements along the axis with t dividing `local` (whole
                   rows, whole MX blocks): each shard quantizes its own, and its codes
                   and scales are its part of the whole tensor's;
  across shards    each group spans the whole axis (one tensor-wide amax; AxisScaling
                   reducing along the axis): a shard needs every shard's amax, a
                   collective, before it can cast;
  cut              a block of t elements that `local` does not divide: no shard holds
                   it, and no shard can give the unsharded bytes. Refused.

A global scale (NVFP4's: the whole tensor's amax) is not a group geometry; callers
refuse it on their own terms.
"""

from lowp._schemes import Scheme

_UNITS = ("rows", "columns")  # what a 2-D tensor holds along axis 0 and axis 1


def shard_groups(scheme: Scheme, axis: int, local: int) -> int | None:
    """The extent along `axis` (0 or 1) of `scheme`'s groups on a 2-D tensor split
    along it into shards of `local` elements, each shard holding whole groups; None
    where each group spans the whole axis (across shards).

    Raises ValueError naming the shard size and the block where a shard would cut a
    block: "a shard of 16 rows splits the 32-row blocks of MXScaling(...)".

    >>> import lowp
    >>> from lowp import extend
    >>> extend.shard_groups(lowp.MXScaling("float8_e4m3fn"), 1, 64)
    32
    >>> extend.shard_groups(lowp.AxisScaling("float8_e4m3fn", axis=-2), 0, 64) is None
    True
    """
    if axis not in (0, 1):
        raise ValueError(f"shard_groups splits a 2-D tensor along axis 0 or 1, got {axis!r}")
    if local < 1:
        raise ValueError(f"a shard holds at least one element along the split, got {local!r}")
    tile = scheme.tiles(2)[axis]
    if tile is not None and local % tile:
        unit = _UNITS[axis]
        raise ValueError(
            f"a shard of {local} {unit} splits the {tile}-{unit[:-1]} blocks of {scheme}"
        )
    return tile
