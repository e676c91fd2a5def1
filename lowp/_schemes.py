"""Scaling schemes (spec §3): which elements share a scale, and how the scale is made.

A scheme is a frozen dataclass that checks its own fields. It knows nothing of arrays
beyond shapes, and it carries every rule of its geometry that a backend would otherwise
write again (the `Scaling` protocol):

  family          "float" (float32 scales, spec §3.1), "mx" (e8m0 scales, §3.2) or
                  "nvfp4" (e4m3 block scales and a global scale, §3.3): which arithmetic
                  quantizes it. Backends dispatch on the family, never on the class.
  scale_format    the format its scales are stored in.
  check_shape     validates an input shape.
  tiles(rank)     the extent of one group along each axis: None for the whole axis, an
                  int b for runs of b consecutive elements (the last run along an axis may
                  be partial where the scheme admits it, as BlockScaling's edge tiles).
  scale_shape     the plain layout of its scales: one per group, in the axes' order.
  permuted(dims)  the scheme that groups `x.permute(dims)` as this one groups x, or None.
  reshaped(old, new), selected(dim, rank)
                  the same for `x.reshape(new)` and `x.select(dim, i)`: None where a
                  group would not stay one group (a quantized tensor's view ops).
  spec, to_fields the codec: the command-line text `from_spec` reads back, and the JSON
                  object of the interchange file (`from_fields` reads it back).

The arithmetic lives in `lowp._quantize`, the groups in `lowp._groups`.
"""

import dataclasses
import math
import typing

from lowp import _formats

MX_MODES = ("floor", "ceil", "rceil")


class Scaling:
    """What every scheme class shares: the codec and the defaults of the protocol.

    A subclass is a frozen dataclass with `kind` (its name in a spec), `family` and
    `scale_format`, and defines `check_shape`, `scale_shape`, `tiles`, `permuted`,
    `reshaped` and `selected`.
    """

    kind: typing.ClassVar[str]
    family: typing.ClassVar[str]
    scale_format: typing.ClassVar[str]
    __dataclass_fields__: typing.ClassVar[dict[str, typing.Any]]  # every subclass is a dataclass

    @property
    def spec(self) -> str:
        """The text `from_spec` builds this scheme from, every field spelled out:
        `MXScaling(mode="rceil")` -> "mx:fmt=float8_e4m3fn:block=32:mode=rceil:axis=-1"."""
        parts = [self.kind]
        for name in self.__dataclass_fields__:  # field order; traceable by torch.compile
            value = getattr(self, name)
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, tuple):
                text = "x".join(str(n) for n in value)
            else:
                text = str(value)
            parts.append(f"{name}={text}")
        return ":".join(parts)

    @classmethod
    def json_types(cls) -> dict[str, typing.Any]:
        """Each field's JSON type (str, int, bool, list), in field order: the schema of
        this scheme's object in an interchange file."""
        types: dict[str, typing.Any] = {}
        for field in dataclasses.fields(cls):
            kind = typing.get_origin(field.type) or field.type
            types[field.name] = list if kind is tuple else kind
        return types

    def to_fields(self, rank: int) -> dict:
        """The scheme as an interchange file stores it (spec §9): {"kind": class name,
        field: value, ...}, an axis normalised for a rank-`rank` tensor, a tuple a list."""
        out: dict[str, typing.Any] = {"kind": type(self).__name__}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "axis":  # a file says which axis, not how it was spelled
                value = normalize_axis(value, rank, self)
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out


def _check_format(owner: str, fmt) -> None:
    _formats.element_format(fmt)  # raises ValueError naming an unknown format


def _check_bool(owner: str, field: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{field} must be a bool, got {value!r}")


def _check_positive_int(owner: str, field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{field} must be a positive int, got {value!r}")


def _check_axis_field(owner: str, axis) -> None:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"{owner}.axis must be an int, got {axis!r}")


def normalize_axis(axis: int, rank: int, scheme) -> int:
    """`axis` as a non-negative index into a shape of `rank` dims; ValueError if out of range."""
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} is out of range for a rank-{rank} input ({scheme})")
    return axis % rank


def _check_rank(shape: tuple[int, ...], minimum: int, scheme) -> None:
    if len(shape) < minimum:
        raise ValueError(
            f"{type(scheme).__name__} needs an input of rank >= {minimum}, got shape {shape}"
        )


def _check_fp4_packing(shape: tuple[int, ...], fmt: str, scheme) -> None:
    """float4 codes pack two a byte along the last axis (spec §5)."""
    if fmt != "float4_e2m1fn":
        return
    if len(shape) == 0 or shape[-1] % 2:
        raise ValueError(
            f"float4_e2m1fn codes pack two a byte along the last axis, which must be even; "
            f"got shape {shape} ({scheme})"
        )


def _check_grouped_axis(shape, axis, block, fmt, scheme) -> int:
    """The schemes that block one axis: rank >= 1, block divides the axis, fp4 blocks
    along the last axis."""
    _check_rank(shape, 1, scheme)
    ax = normalize_axis(axis, len(shape), scheme)
    if shape[ax] % block:
        raise ValueError(
            f"block {block} does not divide axis {axis} of size {shape[ax]} "
            f"(shape {shape}, {scheme}); lowp never pads silently"
        )
    if fmt == "float4_e2m1fn" and ax != len(shape) - 1:
        raise ValueError(
            f"float4_e2m1fn blocks must run along the last axis (packing, spec §5), got axis "
            f"{axis} for shape {shape} ({scheme}); quantize a transposed copy instead"
        )
    _check_fp4_packing(shape, fmt, scheme)
    return ax


def _tiles_along(axis: int, block: int | None, rank: int, scheme) -> tuple[int | None, ...]:
    """Tiles of a scheme grouping along one axis: `block` there (None: all of it), 1 elsewhere."""
    ax = normalize_axis(axis, rank, scheme)
    return tuple(block if d == ax else 1 for d in range(rank))


def _replace(scheme, **changes):
    """`dataclasses.replace`, spelled with the class and its field names only, which
    torch.compile's tracer follows when a frontend calls it on a constant scheme."""
    fields = {name: getattr(scheme, name) for name in scheme.__dataclass_fields__}
    return type(scheme)(**{**fields, **changes})


def _axis_permuted(scheme, dims):
    """`scheme` with its axis where `dims` moves it (spelled from the end); None where
    packed fp4 codes would leave the last axis."""
    rank = len(dims)
    if scheme.fmt == "float4_e2m1fn" and dims[-1] != rank - 1:
        return None
    return _replace(scheme, axis=list(dims).index(scheme.axis % rank) - rank)


def _same_axis(old: tuple, axis: int, new: tuple) -> int | None:
    """The dim of `new` that is `old`'s dim `axis` with the same dims before and after."""
    before, size, after = math.prod(old[:axis]), old[axis], math.prod(old[axis + 1 :])
    for j, n in enumerate(new):
        if n == size and math.prod(new[:j]) == before and math.prod(new[j + 1 :]) == after:
            return j
    return None


def _axis_reshaped(scheme, old: tuple, new: tuple):
    """`scheme` for `x.reshape(new)`: its axis must stay one dim, with the same elements
    before and after it; None otherwise."""
    axis = _same_axis(old, scheme.axis % len(old), new)
    return None if axis is None else _replace(scheme, axis=axis - len(new))


def _axis_selected(scheme, dim: int, rank: int):
    """`scheme` for `x.select(dim, i)`: None along its axis (a group cut to one element)."""
    ax = scheme.axis % rank
    if dim % rank == ax:
        return None
    return _replace(scheme, axis=ax - (dim % rank < ax) - (rank - 1))


@dataclasses.dataclass(frozen=True)
class TensorScaling(Scaling):
    """One float32 scale for the whole tensor (spec §3.1). Scale shape `()`.

    Attributes:
      fmt: element format.
      pow2: round the encode multiplier down to a power of two.
    """

    fmt: str = "float8_e4m3fn"
    pow2: bool = False

    kind = "tensor"
    family = "float"
    scale_format = "float32"

    def __post_init__(self):
        _check_format("TensorScaling", self.fmt)
        _check_bool("TensorScaling", "pow2", self.pow2)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """Any shape; packed float4 codes need a last dim, of even size (a ValueError
        names the shape)."""
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """`()`: one scale, whatever the shape."""
        return ()

    def tiles(self, rank: int) -> tuple[int | None, ...]:
        """`(None,) * rank`: one group spanning every axis."""
        return (None,) * rank

    def permuted(self, dims) -> "TensorScaling | None":
        """This scheme, for `x.permute(dims)`; None where packed float4 codes would leave
        the last axis."""
        if self.fmt == "float4_e2m1fn" and dims[-1] != len(dims) - 1:
            return None
        return self

    def reshaped(self, old: tuple, new: tuple) -> "TensorScaling":
        """This scheme: a reshape keeps the one group."""
        return self

    def selected(self, dim: int, rank: int) -> "TensorScaling":
        """This scheme: a slice of the one group keeps its scale."""
        return self  # a part of the one group keeps its scale


@dataclasses.dataclass(frozen=True)
class AxisScaling(Scaling):
    """One float32 scale per slice along `axis` (spec §3.1): "rowwise" for a GEMM operand
    when `axis` is its reduction axis. Scale shape = input shape with `axis` of size 1.

    Attributes:
      fmt: element format.
      axis: the axis whose elements share a scale (negative counts from the end).
      pow2: round the encode multiplier down to a power of two.
    """

    fmt: str = "float8_e4m3fn"
    axis: int = -1
    pow2: bool = False

    kind = "axis"
    family = "float"
    scale_format = "float32"

    def __post_init__(self):
        _check_format("AxisScaling", self.fmt)
        _check_axis_field("AxisScaling", self.axis)
        _check_bool("AxisScaling", "pow2", self.pow2)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """Rank >= 1 with `axis` in range; packed float4 codes need an even last dim.
        A ValueError names the shape."""
        _check_rank(shape, 1, self)
        normalize_axis(self.axis, len(shape), self)
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """`shape` with `axis` of size 1: one scale per slice along `axis`."""
        ax = normalize_axis(self.axis, len(shape), self)
        return shape[:ax] + (1,) + shape[ax + 1 :]

    def tiles(self, rank: int) -> tuple[int | None, ...]:
        """None (the whole axis) along `axis`, 1 along every other."""
        return _tiles_along(self.axis, None, rank, self)

    def permuted(self, dims) -> "AxisScaling | None":
        """The scheme for `x.permute(dims)`: `axis` where `dims` moves it (counted from
        the end); None where packed float4 codes would leave the last axis."""
        return _axis_permuted(self, dims)

    def reshaped(self, old: tuple, new: tuple) -> "AxisScaling | None":
        """The scheme for `x.reshape(new)` of an `old`-shaped x: `axis` must stay one dim
        with the same elements before and after it; None otherwise."""
        return _axis_reshaped(self, old, new)

    def selected(self, dim: int, rank: int) -> "AxisScaling | None":
        """The scheme for `x.select(dim, i)` of a rank-`rank` x; None when `dim` is `axis`
        (each group would be cut to one element)."""
        return _axis_selected(self, dim, rank)


@dataclasses.dataclass(frozen=True)
class BlockScaling(Scaling):
    """One float32 scale per `block[0] x block[1]` tile of the last two dims (spec §3.1).

    Edge tiles may be partial. Scale shape `(..., ceil(R/b0), ceil(C/b1))`.
    `(1, 128)` activations with `(128, 128)` weights is the DeepSeek-V3 recipe.

    Attributes:
      fmt: element format.
      block: tile shape over the last two dims.
      pow2: round the encode multiplier down to a power of two.
    """

    fmt: str = "float8_e4m3fn"
    block: tuple[int, int] = (1, 128)
    pow2: bool = False

    kind = "block"
    family = "float"
    scale_format = "float32"

    def __post_init__(self):
        _check_format("BlockScaling", self.fmt)
        if not isinstance(self.block, (tuple, list)) or len(self.block) != 2:
            raise ValueError(f"BlockScaling.block must be a pair of ints, got {self.block!r}")
        for b in self.block:
            _check_positive_int("BlockScaling", "block", b)
        object.__setattr__(self, "block", tuple(self.block))
        _check_bool("BlockScaling", "pow2", self.pow2)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """Rank >= 2 (any sizes: edge tiles may be partial); packed float4 codes need an
        even last dim. A ValueError names the shape."""
        _check_rank(shape, 2, self)
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """`(..., ceil(R / block[0]), ceil(C / block[1]))` for `shape` `(..., R, C)`."""
        rows, cols = shape[-2:]
        return shape[:-2] + (math.ceil(rows / self.block[0]), math.ceil(cols / self.block[1]))

    def tiles(self, rank: int) -> tuple[int | None, ...]:
        """`block` over the last two dims, 1 along the leading ones."""
        return (1,) * (rank - 2) + self.block

    def permuted(self, dims) -> "BlockScaling | None":
        """The same tiles where the last two dims stay, transposed tiles where they swap;
        None where a tiled dim would move into the batch dims (or fp4 off the last)."""
        rank = len(dims)
        last_two = list(dims[-2:])
        if last_two == [rank - 2, rank - 1]:
            return self
        if last_two == [rank - 1, rank - 2] and self.fmt != "float4_e2m1fn":
            return _replace(self, block=self.block[::-1])
        return None

    def reshaped(self, old: tuple, new: tuple) -> "BlockScaling | None":
        """The same tiles where the last dim stays and rows stay or merge in whole tiles."""
        if len(old) < 2 or len(new) < 2 or new[-1] != old[-1]:
            return None
        b0, rows = self.block[0], old[-2]
        return self if new[-2] == rows or (rows % b0 == 0 and new[-2] % b0 == 0) else None

    def selected(self, dim: int, rank: int) -> "BlockScaling | None":
        """This scheme for `x.select(dim, i)` along a leading dim; None along the last two."""
        return self if dim % rank < rank - 2 else None  # a tiled dim cannot lose an index


class _BlocksAlongAxis(Scaling):
    """The geometry of a scheme whose groups are `block` consecutive elements along
    `axis` (MX, NVFP4, GroupScaling): `block` must divide the axis, and packed fp4
    codes need it last."""

    fmt: str
    block: int
    axis: int

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """Rank >= 1, `axis` in range, `block` dividing it (lowp never pads), float4
        blocks along the last axis, which must be even. A ValueError names the shape."""
        _check_grouped_axis(shape, self.axis, self.block, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """`shape` with `axis` divided by `block`: one scale per block."""
        ax = normalize_axis(self.axis, len(shape), self)
        return shape[:ax] + (shape[ax] // self.block,) + shape[ax + 1 :]

    def tiles(self, rank: int) -> tuple[int | None, ...]:
        """`block` along `axis`, 1 along every other."""
        return _tiles_along(self.axis, self.block, rank, self)

    def permuted(self, dims):
        """The scheme for `x.permute(dims)`: `axis` where `dims` moves it (counted from
        the end); None where packed float4 codes would leave the last axis."""
        return _axis_permuted(self, dims)

    def reshaped(self, old: tuple, new: tuple):
        """The scheme for `x.reshape(new)` of an `old`-shaped x: `axis` must stay one dim
        with the same elements before and after it; None otherwise."""
        return _axis_reshaped(self, old, new)

    def selected(self, dim: int, rank: int):
        """The scheme for `x.select(dim, i)` of a rank-`rank` x; None when `dim` is `axis`
        (each block would be cut to one element)."""
        return _axis_selected(self, dim, rank)


@dataclasses.dataclass(frozen=True)
class MXScaling(_BlocksAlongAxis):
    """OCP microscaling (spec §3.2): one e8m0 scale byte per `block` consecutive
    elements along `axis`. Scale shape = input shape with `axis` divided by `block`.

    Attributes:
      fmt: element format (mxfp8: e4m3/e5m2, mxfp6: e2m3/e3m2, mxfp4: e2m1).
      block: elements per scale (32 in the OCP spec).
      mode: how the scale exponent is chosen: "floor" (OCP), "ceil", or "rceil"
        (NVIDIA's, the exact ceil(log2(amax / max))).
      axis: the blocked axis; float4 needs it last.
    """

    fmt: str = "float8_e4m3fn"
    block: int = 32
    mode: str = "floor"
    axis: int = -1

    kind = "mx"
    family = "mx"
    scale_format = "float8_e8m0fnu"

    def __post_init__(self):
        _check_format("MXScaling", self.fmt)
        _check_positive_int("MXScaling", "block", self.block)
        if self.mode not in MX_MODES:
            raise ValueError(f"MXScaling.mode must be one of {MX_MODES}, got {self.mode!r}")
        _check_axis_field("MXScaling", self.axis)


@dataclasses.dataclass(frozen=True)
class NVFP4Scaling(_BlocksAlongAxis):
    """NVFP4 (spec §3.3): e2m1 elements, one e4m3 scale per `block` elements along
    `axis`, and with `global_scale` one float32 decode scale for the whole tensor.

    Attributes:
      block: elements per block scale (16 for NVFP4).
      global_scale: keep a per-tensor float32 scale so block scales use e4m3's range.
      axis: the blocked axis; must be the last (fp4 packing).
    """

    block: int = 16
    global_scale: bool = True
    axis: int = -1

    fmt = "float4_e2m1fn"  # not a field: NVFP4 elements are always e2m1
    kind = "nvfp4"
    family = "nvfp4"
    scale_format = "float8_e4m3fn"

    def __post_init__(self):
        _check_positive_int("NVFP4Scaling", "block", self.block)
        _check_bool("NVFP4Scaling", "global_scale", self.global_scale)
        _check_axis_field("NVFP4Scaling", self.axis)


@dataclasses.dataclass(frozen=True)
class NVFP4TileScaling(Scaling):
    """NVFP4 with 2-D block scales (spec §3.3): e2m1 elements, one e4m3 scale per
    `tile[0] x tile[1]` tile of the last two dims, and with `global_scale` one float32
    decode scale for the whole tensor. Transformer Engine's NVFP4 training quantizes
    weights so (16x16), so that w and w.T share their codes' values: tile (i, j) of w is
    tile (j, i) of w.T. Scale shape `(..., R/t0, C/t1)`; the tiles must divide both dims
    (NVFP4 never pads) and codes pack two a byte along the last axis.

    Attributes:
      tile: the tile over the last two dims ((16, 16) for NVFP4 training).
      global_scale: keep a per-tensor float32 scale so block scales use e4m3's range.
    """

    tile: tuple[int, int] = (16, 16)
    global_scale: bool = True

    fmt = "float4_e2m1fn"  # not a field: NVFP4 elements are always e2m1
    kind = "nvfp4_tile"
    family = "nvfp4"
    scale_format = "float8_e4m3fn"

    def __post_init__(self):
        if not isinstance(self.tile, (tuple, list)) or len(self.tile) != 2:
            raise ValueError(f"NVFP4TileScaling.tile must be a pair of ints, got {self.tile!r}")
        for t in self.tile:
            _check_positive_int("NVFP4TileScaling", "tile", t)
        object.__setattr__(self, "tile", tuple(self.tile))
        _check_bool("NVFP4TileScaling", "global_scale", self.global_scale)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        """ValueError unless the tile divides the last two dims and fp4 codes pack."""
        _check_rank(shape, 2, self)
        for dim, t in zip(shape[-2:], self.tile, strict=True):
            if dim % t:
                raise ValueError(
                    f"tile {self.tile} does not divide the last two dims of shape {shape} "
                    f"({self}); lowp never pads silently"
                )
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The input shape with its last two dims divided by the tile."""
        rows, cols = shape[-2:]
        return shape[:-2] + (rows // self.tile[0], cols // self.tile[1])

    def tiles(self, rank: int) -> tuple[int | None, ...]:
        """One element along each leading dim, the tile along the last two."""
        return (1,) * (rank - 2) + self.tile

    def permuted(self, dims) -> "NVFP4TileScaling | None":
        """Itself where the last two dims stay; None otherwise (packed codes would leave
        the last axis: quantize a transposed copy, whose tiles hold the same values)."""
        rank = len(dims)
        return self if list(dims[-2:]) == [rank - 2, rank - 1] else None

    def reshaped(self, old: tuple, new: tuple) -> "NVFP4TileScaling | None":
        """Itself where the last dim stays and the rows still split into whole tiles."""
        if len(old) < 2 or len(new) < 2 or new[-1] != old[-1]:
            return None
        return self if new[-2] == old[-2] or new[-2] % self.tile[0] == 0 else None

    def selected(self, dim: int, rank: int) -> "NVFP4TileScaling | None":
        """Itself where a leading dim (not a tiled one) is indexed away."""
        return self if dim % rank < rank - 2 else None


@dataclasses.dataclass(frozen=True)
class GroupScaling(_BlocksAlongAxis):
    """One float32 scale per `block` consecutive elements along `axis` (spec §3.1):
    float scales on MX's groups (torchao's per-group, Qwix's sub-channel scaling). Scale
    shape = input shape with `axis` divided by `block`; `block` must divide the axis.

    Attributes:
      fmt: element format.
      block: elements per scale.
      axis: the grouped axis (negative counts from the end); float4 needs it last.
      pow2: round the encode multiplier down to a power of two.
    """

    fmt: str = "float8_e4m3fn"
    block: int = 32
    axis: int = -1
    pow2: bool = False

    kind = "group"
    family = "float"
    scale_format = "float32"

    def __post_init__(self):
        _check_format("GroupScaling", self.fmt)
        _check_positive_int("GroupScaling", "block", self.block)
        _check_axis_field("GroupScaling", self.axis)
        _check_bool("GroupScaling", "pow2", self.pow2)


Scheme = (
    TensorScaling
    | AxisScaling
    | BlockScaling
    | MXScaling
    | NVFP4Scaling
    | GroupScaling
    | NVFP4TileScaling
)
SCHEME_TYPES = (
    TensorScaling,
    AxisScaling,
    BlockScaling,
    MXScaling,
    NVFP4Scaling,
    GroupScaling,
    NVFP4TileScaling,
)
# The schemes with an `axis` field (the others group whole tensors or the last two dims).
AXIS_SCHEME_TYPES = (AxisScaling, MXScaling, NVFP4Scaling, GroupScaling)


def scale_format(scheme: Scheme) -> str:
    """The format scales are stored in: float32, e8m0 bytes (MX) or e4m3 bytes (NVFP4)."""
    return scheme.scale_format


def check_scheme(scheme) -> None:
    if not isinstance(scheme, SCHEME_TYPES):
        raise TypeError(
            f"expected a lowp scheme ({', '.join(t.__name__ for t in SCHEME_TYPES)}), "
            f"got {scheme!r}"
        )


_SPEC_KINDS = {scheme_type.kind: scheme_type for scheme_type in SCHEME_TYPES}
_FIELDS_KINDS = {scheme_type.__name__: scheme_type for scheme_type in SCHEME_TYPES}


def from_fields(doc: dict) -> Scheme:
    """The scheme of an interchange file's JSON object (`Scaling.to_fields`'s output):
    its class from "kind", its fields as keywords. Checking the object's keys and JSON
    types is the reader's (`lowp._interchange`), which names the file; this builds the
    scheme, which checks its values (ValueError, TypeError)."""
    scheme_type = _FIELDS_KINDS[doc["kind"]]
    return scheme_type(**{name: doc[name] for name in scheme_type.json_types()})


def from_spec(spec: str) -> Scheme:
    """A scheme from a short text spec, for command lines: `KIND[:FIELD=VALUE]...`.

    KIND is a scheme class's `kind` (tensor, axis, block, mx, nvfp4, ...); fields are
    the dataclass's, values are ints, true/false, `RxC` for a block shape, or format/mode
    names. `scheme.spec` is the text that gives `scheme` back, every field spelled out.

    >>> from_spec("mx:fmt=float8_e5m2:mode=floor")
    MXScaling(fmt='float8_e5m2', block=32, mode='floor', axis=-1)
    >>> from_spec("block:block=1x128:pow2=true")
    BlockScaling(fmt='float8_e4m3fn', block=(1, 128), pow2=True)
    """
    kind, *assignments = spec.split(":")
    if kind not in _SPEC_KINDS:
        raise ValueError(
            f"unknown scheme kind {kind!r} in {spec!r}; expected one of {tuple(_SPEC_KINDS)}"
        )
    scheme_type = _SPEC_KINDS[kind]
    fields = {f.name: f.type for f in dataclasses.fields(scheme_type)}
    kwargs: dict[str, typing.Any] = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if key in kwargs:
            raise ValueError(f"field {key!r} given twice in {spec!r}")
        if not sep or key not in fields:
            raise ValueError(
                f"bad field {assignment!r} in {spec!r}; {kind} takes {', '.join(fields)} as FIELD=VALUE"
            )
        if text in ("true", "false"):
            kwargs[key] = text == "true"
        elif key in ("block", "tile") and "x" in text:
            kwargs[key] = tuple(int(n) for n in text.split("x"))
        elif text.lstrip("-").isdigit():
            kwargs[key] = int(text)
        else:
            kwargs[key] = text
    return scheme_type(**kwargs)
