"""Scaling schemes (spec §3): which elements share a scale, and how the scale is made.

A scheme is a frozen dataclass that checks its own fields. It knows nothing of arrays
beyond shapes: `check_shape` validates an input shape and `scale_shape` gives the plain
layout of its scales. The arithmetic lives in `lowp._quantize`.
"""

import dataclasses
import math

from lowp import _formats

MX_MODES = ("floor", "ceil", "rceil")


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
    """Shared by MX and NVFP4: rank >= 1, block divides the axis, fp4 blocks along the last axis."""
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


@dataclasses.dataclass(frozen=True)
class TensorScaling:
    """One float32 scale for the whole tensor (spec §3.1). Scale shape `()`.

    Attributes:
      fmt: element format.
      pow2: round the encode multiplier down to a power of two.
    """

    fmt: str = "float8_e4m3fn"
    pow2: bool = False

    def __post_init__(self):
        _check_format("TensorScaling", self.fmt)
        _check_bool("TensorScaling", "pow2", self.pow2)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return ()


@dataclasses.dataclass(frozen=True)
class AxisScaling:
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

    def __post_init__(self):
        _check_format("AxisScaling", self.fmt)
        _check_axis_field("AxisScaling", self.axis)
        _check_bool("AxisScaling", "pow2", self.pow2)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        _check_rank(shape, 1, self)
        normalize_axis(self.axis, len(shape), self)
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        ax = normalize_axis(self.axis, len(shape), self)
        return shape[:ax] + (1,) + shape[ax + 1 :]


@dataclasses.dataclass(frozen=True)
class BlockScaling:
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

    def __post_init__(self):
        _check_format("BlockScaling", self.fmt)
        if not isinstance(self.block, (tuple, list)) or len(self.block) != 2:
            raise ValueError(f"BlockScaling.block must be a pair of ints, got {self.block!r}")
        for b in self.block:
            _check_positive_int("BlockScaling", "block", b)
        object.__setattr__(self, "block", tuple(self.block))
        _check_bool("BlockScaling", "pow2", self.pow2)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        _check_rank(shape, 2, self)
        _check_fp4_packing(shape, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        rows, cols = shape[-2:]
        return shape[:-2] + (math.ceil(rows / self.block[0]), math.ceil(cols / self.block[1]))


@dataclasses.dataclass(frozen=True)
class MXScaling:
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

    def __post_init__(self):
        _check_format("MXScaling", self.fmt)
        _check_positive_int("MXScaling", "block", self.block)
        if self.mode not in MX_MODES:
            raise ValueError(f"MXScaling.mode must be one of {MX_MODES}, got {self.mode!r}")
        _check_axis_field("MXScaling", self.axis)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        _check_grouped_axis(shape, self.axis, self.block, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        ax = normalize_axis(self.axis, len(shape), self)
        return shape[:ax] + (shape[ax] // self.block,) + shape[ax + 1 :]


@dataclasses.dataclass(frozen=True)
class NVFP4Scaling:
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

    def __post_init__(self):
        _check_positive_int("NVFP4Scaling", "block", self.block)
        _check_bool("NVFP4Scaling", "global_scale", self.global_scale)
        _check_axis_field("NVFP4Scaling", self.axis)

    def check_shape(self, shape: tuple[int, ...]) -> None:
        _check_grouped_axis(shape, self.axis, self.block, self.fmt, self)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        ax = normalize_axis(self.axis, len(shape), self)
        return shape[:ax] + (shape[ax] // self.block,) + shape[ax + 1 :]


Scheme = TensorScaling | AxisScaling | BlockScaling | MXScaling | NVFP4Scaling
SCHEME_TYPES = (TensorScaling, AxisScaling, BlockScaling, MXScaling, NVFP4Scaling)


def scale_format(scheme: Scheme) -> str:
    """The format scales are stored in: float32, e8m0 bytes (MX) or e4m3 bytes (NVFP4)."""
    if isinstance(scheme, MXScaling):
        return "float8_e8m0fnu"
    if isinstance(scheme, NVFP4Scaling):
        return "float8_e4m3fn"
    return "float32"


def check_scheme(scheme) -> None:
    if not isinstance(scheme, SCHEME_TYPES):
        raise TypeError(
            f"expected a lowp scheme ({', '.join(t.__name__ for t in SCHEME_TYPES)}), "
            f"got {scheme!r}"
        )


_SPEC_KINDS = {
    "tensor": TensorScaling,
    "axis": AxisScaling,
    "block": BlockScaling,
    "mx": MXScaling,
    "nvfp4": NVFP4Scaling,
}


def from_spec(spec: str) -> Scheme:
    """A scheme from a short text spec, for command lines: `KIND[:FIELD=VALUE]...`.

    KIND is tensor, axis, block, mx or nvfp4; fields are the dataclass's, values are
    ints, true/false, `RxC` for a block shape, or format/mode names.

    >>> from_spec("mx:fmt=float8_e5m2:mode=floor")
    MXScaling(fmt='float8_e5m2', block=32, mode='floor', axis=-1)
    >>> from_spec("block:block=1x128:pow2=true")
    BlockScaling(fmt='float8_e4m3fn', block=(1, 128), pow2=True)
    """
    kind, *assignments = spec.split(":")
    if kind not in _SPEC_KINDS:
        raise ValueError(f"unknown scheme kind {kind!r} in {spec!r}; expected one of {tuple(_SPEC_KINDS)}")
    scheme_type = _SPEC_KINDS[kind]
    fields = {f.name: f.type for f in dataclasses.fields(scheme_type)}
    kwargs: dict[str, object] = {}
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
        elif key == "block" and "x" in text:
            kwargs[key] = tuple(int(n) for n in text.split("x"))
        elif text.lstrip("-").isdigit():
            kwargs[key] = int(text)
        else:
            kwargs[key] = text
    return scheme_type(**kwargs)
