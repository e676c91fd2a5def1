"""The conformance cases: which configurations every backend runs, and their inputs.

A *configuration* is what a backend compiles once (a `jax.jit` or `torch.compile`
trace): a scheme at one input shape, input dtype and rounding. It is fed every *edge
case* of spec §6 built for that shape and that scheme's groups, so a case is a
(configuration, edge case) pair. Compilation, not arithmetic, is what costs time, so
the plans below are sized in configurations:

- "full": every scheme x element format of `schemes_for_rank` at ranks 1-4, each with
  every input dtype x rounding of `INPUTS`, plus every one at an empty shape.
- "quick": every scheme x format x rank with float32 input and nearest rounding; one
  in three also with one of the other inputs (stochastic rounding, bfloat16, float16,
  in turn); one in twelve also at an empty shape, and one in twelve with the extra
  checks (every output dtype, the cuBLAS scale layout, dequantizing the reference's
  bytes).
- "thin": every scheme kind with every element format once, every MX mode and NVFP4
  variant, ranks and inputs in turn: for backends that spend seconds per compile.

Inputs are NumPy arrays of the configuration's dtype (bfloat16 as ml_dtypes.bfloat16);
each backend receives exactly those bits. Every generator is seeded from the case's
name, so a case is the same input wherever and in whatever order it runs.
"""

import dataclasses
import math
import zlib

import ml_dtypes
import numpy as np

import lowp
from lowp import extend

ELEMENTS = tuple(lowp.ELEMENT_FORMATS)
MX_MODES = extend.MX_MODES
SHAPES = {1: (64,), 2: (6, 32), 3: (2, 3, 32), 4: (2, 2, 2, 32)}
# One zero-sized dim in a different place per rank; every scheme of that rank admits it.
EMPTY_SHAPES = {1: (0,), 2: (6, 0), 3: (2, 0, 32), 4: (2, 2, 0, 32)}
INPUTS = (
    ("float32", "nearest"),
    ("float32", "stochastic"),
    ("bfloat16", "nearest"),
    ("float16", "nearest"),
)
HP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
SIZES = ("thin", "quick", "full")
KINDS = tuple(scheme_type.kind for scheme_type in extend.SCHEME_TYPES)  # the matrix rows
EDGE_CASES = (
    "random",
    "zeros",
    "nan",
    "inf",
    "nonfinite_groups",
    "ties",
    "above_max",
    "pow2",
    "subnormal",
    "only_subnormals",
    "huge",
    "tiny",
    "random_exponents",
)
VARIANTS = {"pow2": 3}  # more than one input where the list of group maxima is long
F32 = np.float32


def schemes_for_rank(rank: int) -> list:
    """Every scheme x element format lowp admits at SHAPES[rank]: pow2 on and off, both
    axes, tiles that leave partial edge tiles (3x5 over 32 columns, 2x4 over 3 rows),
    every MX mode, MX and float-scaled groups along axis 0, and the NVFP4 variants (2-D
    tiles from rank 2)."""
    out = []
    for fmt in ELEMENTS:
        out += [lowp.TensorScaling(fmt), lowp.TensorScaling(fmt, pow2=True)]
        out += [lowp.AxisScaling(fmt, axis=-1), lowp.AxisScaling(fmt, axis=0, pow2=True)]
        if rank >= 2:
            out += [
                lowp.BlockScaling(fmt, block=(2, 4)),
                lowp.BlockScaling(fmt, block=(3, 5), pow2=True),
            ]
        out += [lowp.MXScaling(fmt, block=8, mode=mode) for mode in MX_MODES]
        if fmt != "float4_e2m1fn" and rank >= 2:
            out.append(lowp.MXScaling(fmt, block=2, mode="rceil", axis=0))
        out.append(lowp.GroupScaling(fmt, block=8))
        if fmt != "float4_e2m1fn" and rank >= 2:
            out.append(lowp.GroupScaling(fmt, block=2, axis=0, pow2=True))
    out += [
        lowp.MXScaling(),
        lowp.NVFP4Scaling(),
        lowp.NVFP4Scaling(global_scale=False),
    ]
    out.append(lowp.NVFP4Scaling(block=8))
    if rank >= 2:  # 2-D NVFP4 tiles: every row of the shape by 16 columns
        out.append(lowp.NVFP4TileScaling(tile=(SHAPES[rank][-2], 16)))
    return out


def scheme_id(scheme) -> str:
    """A short readable id, e.g. MXScaling(fmt='float8_e4m3fn', block=8, mode='ceil') ->
    mx-e4m3fn-block=8-mode=ceil."""
    parts = [scheme.kind, scheme.fmt.split("_", 1)[1]]
    for field in dataclasses.fields(scheme):
        value = getattr(scheme, field.name)
        if field.name != "fmt" and value != field.default:
            parts.append(f"{field.name}={value}".replace(" ", ""))
    return "-".join(parts)


@dataclasses.dataclass(frozen=True)
class Configuration:
    """A scheme at one input shape, dtype and rounding: one compilation on a backend.

    Attributes:
      scheme: the lowp scheme.
      shape: the input shape (SHAPES[rank] or EMPTY_SHAPES[rank]).
      hp_dtype: "float32", "bfloat16" or "float16".
      rounding: "nearest" or "stochastic" (bits from a seed derived from the id).
      extras: also dequantize to every output dtype, convert the scales to the
        cuBLAS layout (MX/NVFP4 along the last axis) and dequantize the reference's
        own bytes loaded into the backend.
    """

    scheme: lowp.Scheme
    shape: tuple[int, ...]
    hp_dtype: str = "float32"
    rounding: str = "nearest"
    extras: bool = False

    @property
    def kind(self) -> str:
        return self.scheme.kind

    @property
    def id(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        extras = "-extras" if self.extras else ""
        return f"{scheme_id(self.scheme)}-{shape}-{self.hp_dtype}-{self.rounding}{extras}"

    @property
    def out_dtypes(self) -> tuple[str, ...]:
        """The dtypes the backend dequantizes to: the input's, or all three with extras."""
        return tuple(HP_DTYPES) if self.extras else (self.hp_dtype,)

    def rounding_kwargs(self) -> dict:
        """The keyword arguments of `quantize` for this rounding, the same on every backend.

        The seed exceeds 2**32 (frameworks must take it mod 2**32, spec §4) and differs
        per configuration, as does the offset."""
        if self.rounding == "nearest":
            return {}
        tag = zlib.crc32(self.id.encode())
        return {"rounding": "stochastic", "seed": 2**32 + tag, "offset": tag % 1000}


def configurations(size: str) -> list[Configuration]:
    """The plan of `size` ("thin", "quick" or "full"); ValueError naming anything else."""
    if size == "thin":
        return _thin()
    if size not in SIZES:
        raise ValueError(f"unknown conformance size {size!r}; expected one of {SIZES}")
    out = []
    for rank, shape in SHAPES.items():
        for j, scheme in enumerate(schemes_for_rank(rank)):
            k = j + rank  # rotates what each (rank, scheme) gets across the ranks
            if size == "full":
                for hp_dtype, rounding in INPUTS:
                    extras = (hp_dtype, rounding) == ("float32", "nearest")
                    out.append(Configuration(scheme, shape, hp_dtype, rounding, extras))
                    out.append(Configuration(scheme, EMPTY_SHAPES[rank], hp_dtype, rounding))
                continue
            out.append(Configuration(scheme, shape, extras=k % 12 == 1))
            if k % 3 == 0:
                out.append(Configuration(scheme, shape, *INPUTS[1 + (k // 3) % 3]))
            if k % 12 == 7:
                out.append(Configuration(scheme, EMPTY_SHAPES[rank]))
    return out


def _thin() -> list[Configuration]:
    """Each element format meets each scheme kind and MX mode once; ranks and inputs rotate."""
    schemes = []
    for i, fmt in enumerate(ELEMENTS):
        odd = bool(i % 2)
        schemes += [
            lowp.TensorScaling(fmt, pow2=odd),
            lowp.AxisScaling(fmt, axis=-1 if odd else 0, pow2=not odd),
            lowp.BlockScaling(fmt, block=(3, 5) if odd else (2, 4), pow2=odd),
        ]
        schemes += [lowp.MXScaling(fmt, block=8, mode=mode) for mode in MX_MODES]
        schemes.append(lowp.GroupScaling(fmt, block=8, pow2=odd))
    schemes.append(lowp.MXScaling("float8_e5m2", block=2, mode="rceil", axis=0))
    schemes.append(lowp.GroupScaling("float8_e4m3fn", block=2, axis=0))
    schemes += [lowp.NVFP4Scaling(), lowp.NVFP4Scaling(global_scale=False, block=8)]
    out = []
    for i, scheme in enumerate(schemes):
        needs_rank2 = scheme.kind == "block" or getattr(scheme, "axis", -1) == 0
        rank = 1 if i % 4 == 0 and not needs_rank2 else 2 + i % 3
        hp_dtype, rounding = INPUTS[i % len(INPUTS)]
        out.append(Configuration(scheme, SHAPES[rank], hp_dtype, rounding, extras=i % 5 == 0))
    return out


# ---------------------------------------------------------------------------------------
# Inputs


def inputs(config: Configuration) -> list[tuple[str, np.ndarray]]:
    """(edge case name, input) pairs of `config`: every edge case and variant, in
    config.hp_dtype (values past float16's range become ±Inf there: more edge cases);
    at an empty shape, the one empty input; for bfloat16/float16 also random bit
    patterns of that dtype, its subnormals included."""
    dtype = HP_DTYPES[config.hp_dtype]
    if math.prod(config.shape) == 0:
        return [("empty", np.zeros(config.shape, dtype))]
    out = []
    for case in EDGE_CASES:
        for variant in range(VARIANTS.get(case, 1)):
            name = f"{case}#{variant}" if case in VARIANTS else case
            x32 = make_input(case, config.shape, config.scheme, variant)
            with np.errstate(over="ignore"):
                out.append((name, x32.astype(dtype)))
    if config.hp_dtype != "float32":
        rng = _rng("hp_patterns", config.shape, config.scheme, 0)
        patterns = rng.integers(0, 2**16, size=config.shape, dtype=np.uint32).astype(np.uint16)
        x = patterns.view(dtype)
        out.append(("hp_patterns", np.where(np.isfinite(x.astype(F32)), x, dtype(1.5))))
    return out


def _rng(case, shape, scheme, variant) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{case}/{tuple(shape)}/{variant}/{scheme}".encode()))


def _next(v, toward) -> np.float32:
    return np.nextafter(F32(v), F32(toward))


def group_ids(shape, scheme) -> np.ndarray:
    """Each element's group: its flat index into the plain scale array."""
    shape = tuple(shape)
    scale_shape = scheme.scale_shape(shape)
    ids = np.arange(math.prod(scale_shape), dtype=np.int64).reshape(scale_shape)
    return np.ascontiguousarray(np.broadcast_to(extend.expand_groups(ids, scheme, shape), shape))


def _leaders(ids: np.ndarray) -> np.ndarray:
    """Flat index of each group's first element."""
    _, first = np.unique(ids.reshape(-1), return_index=True)
    return first


def _per_group(shape, scheme, amaxes, rng, variant, fill=None) -> np.ndarray:
    """Group k gets amax amaxes[k] (cycling, shifted by variant) at its first element,
    with a random sign, and fill * amax elsewhere (fill: uniform in (-1, 1) unless given)."""
    ids = group_ids(shape, scheme).reshape(-1)
    amaxes = np.asarray(amaxes, dtype=np.float64)
    amax = amaxes[(ids + 7 * variant) % len(amaxes)]
    fill = rng.uniform(-1, 1, ids.size) if fill is None else fill
    x = (amax * fill).astype(F32)
    first = _leaders(ids)
    signs = np.where(rng.random(first.size) < 0.5, -1.0, 1.0)
    x[first] = (amax[first] * signs).astype(F32)
    return x.reshape(shape)


def _random(shape, rng) -> np.ndarray:
    """Normal data, one magnitude 10**U(-6, 6) per row (last axis), with ±0."""
    lead = tuple(shape[:-1]) + (1,)
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, size=lead)
    x[rng.random(shape) < 0.05] = 0.0
    x[rng.random(shape) < 0.02] = -0.0
    return x.astype(F32)


def _patterns(shape, rng, exponents=(0, 254)) -> np.ndarray:
    """Random finite float32 patterns, biased exponent field drawn from `exponents`."""
    b = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
    e = rng.integers(exponents[0], exponents[1] + 1, size=shape).astype(np.uint32)
    return ((b & np.uint32(0x807FFFFF)) | (e << np.uint32(23))).view(F32)


def make_input(case: str, shape, scheme, variant: int = 0) -> np.ndarray:
    """float32 input of `shape` for edge case `case` (spec §6 and the boundaries of §3)."""
    shape = tuple(shape)
    rng = _rng(case, shape, scheme, variant)
    n = math.prod(shape)
    fmt = lowp.ELEMENT_FORMATS[scheme.fmt]
    if case == "random":
        return _random(shape, rng)
    if case == "zeros":
        return np.where(rng.random(shape) < 0.5, F32(-0.0), F32(0.0)).astype(F32)
    if case == "nan":
        x = _random(shape, rng).reshape(-1)
        x[n // 3] = np.nan
        return x.reshape(shape)
    if case == "inf":
        x = _random(shape, rng).reshape(-1)
        x[0], x[-1] = np.inf, -np.inf
        return x.reshape(shape)
    if case == "nonfinite_groups":
        # NaN, Inf, -Inf in turn at the first element of every other group.
        x = _random(shape, rng).reshape(-1)
        leaders = _leaders(group_ids(shape, scheme))[::2]
        x[leaders] = np.array([np.nan, np.inf, -np.inf], F32)[np.arange(leaders.size) % 3]
        return x.reshape(shape)
    if case == "ties":
        # Scale 1 (float scales: m = max/max; MX floor/rceil: byte 127), every element on a
        # code or halfway between two, and the tie above max (464 for e4m3) as a group max.
        values = _positive_values(fmt)
        above = values[-1] + (values[-1] - values[-2]) / 2
        grid = np.concatenate([values, (values[:-1] + values[1:]) / 2, [above, 0.0]])
        fill = rng.choice(grid, n) * np.where(rng.random(n) < 0.5, -1, 1) / fmt.max
        return _per_group(shape, scheme, [fmt.max, above], rng, variant, fill)
    if case == "above_max":
        # Every group's max is the tie above max; the others at max, just below and above.
        step = 2.0 ** (fmt.emax - fmt.mbits)
        near = np.array([fmt.max + step / 2, fmt.max, fmt.max - step / 2, fmt.max + step / 4])
        fill = rng.choice(near, n) * rng.choice([-1.0, 1.0], n) / (fmt.max + step / 2)
        return _per_group(shape, scheme, [fmt.max + step / 2], rng, variant, fill)
    if case == "pow2":
        # Group maxima just below, at and just above powers of two and max * 2**k.
        amaxes = []
        for k in range(-126, 128, 11):
            p = F32(2.0**k)
            amaxes += [p, _next(p, 0)]
            if fmt.max * 2.0**k < float(np.finfo(F32).max):
                scaled = F32(fmt.max * 2.0**k)
                amaxes += [scaled, _next(scaled, 0), _next(scaled, np.inf)]
        return _per_group(shape, scheme, amaxes, rng, variant)
    if case == "subnormal":
        # float32 subnormals as whole groups and sprinkled among normals; both signs.
        tiny_normal = F32(2.0**-126)
        amaxes = [F32(1e-40), F32(1e-45), _next(tiny_normal, 0), tiny_normal, F32(3e-39), F32(1.0)]
        x = _per_group(shape, scheme, amaxes, rng, variant).reshape(-1)
        sprinkle = rng.random(n) < 0.3
        x[sprinkle] = (rng.uniform(-1, 1, int(sprinkle.sum())) * 2.0**-126).astype(F32)
        return x.reshape(shape)
    if case == "only_subnormals":
        return _patterns(shape, rng, exponents=(0, 0))
    if case == "huge":
        flt_max = np.finfo(F32).max
        amaxes = [flt_max, _next(flt_max, 0), F32(2.0**127), F32(1e38), F32(1e30), F32(6e37)]
        return _per_group(shape, scheme, amaxes, rng, variant)
    if case == "tiny":
        # Float scales' EPS floor (1e-12) from both sides; NVFP4's S_enc overflow.
        eps = F32(1e-12)
        amaxes = [F32(1e-30), F32(1e-37), F32(2.0**-126), F32(1.5e-38), eps]
        amaxes += [_next(eps, 0), _next(eps, 1)]
        return _per_group(shape, scheme, amaxes, rng, variant)
    if case == "random_exponents":
        return _patterns(shape, rng)
    raise ValueError(f"unknown edge case {case!r}; expected one of {EDGE_CASES}")


def _positive_values(fmt) -> np.ndarray:
    values = fmt.values()
    finite = values[np.isfinite(values) & (values > 0)]
    return np.unique(finite.astype(np.float64))


def random_magnitudes(shape, seed: int, chunk: int | None = None) -> np.ndarray:
    """Random float32 over 1e-30 .. 1e30 with random signs and 1% zeros.

    chunk=None: each element's magnitude is log-uniform. chunk=k: each run of k elements
    along the last axis shares a log-uniform magnitude (times 10**U(-2, 0) per element),
    so group maxima, and so the quotients of the scale formulas, span the range too.
    """
    rng = np.random.default_rng(seed)
    if chunk is None:
        exponent = rng.uniform(-30, 30, size=shape)
    else:
        runs = tuple(shape[:-1]) + (-(-shape[-1] // chunk),)
        per_run = np.repeat(rng.uniform(-30, 30, size=runs), chunk, axis=-1)[..., : shape[-1]]
        exponent = per_run + rng.uniform(-2, 0, size=shape)
    x = rng.standard_normal(shape) * 10.0**exponent
    x[rng.random(shape) < 0.01] = 0.0
    return x.astype(F32)
