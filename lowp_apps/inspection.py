"""`lowp inspect`: what each scheme does to each tensor of a checkpoint (the numbers only).

For every float tensor and every scheme, `inspect_tensor` quantizes with the reference
`quantize` and measures, against the float32 dequantization:

  SQNR       20·log10(‖x‖ / ‖x − dequantized‖) in float64; inf when exact. Elements of
             poisoned groups (NaN/Inf inputs, spec §6) are left out of both norms.
  saturated  |x| / s > max(fmt) + ulp_top/2, where s is the element's group scale and
             ulp_top = 2^(emax − mbits): the element would have rounded above max had the
             range allowed, so the clamp changed it (e4m3: 464). At exactly the midpoint
             ties-to-even rounds up when max's last mantissa bit is odd (every format but
             e4m3), so there the midpoint counts too. Elements of a group whose scale
             is zero (an NVFP4 block scale rounded to 0) are flushed, not saturated.
  flushed    x != 0 but dequantized == 0.
  scales     the decode scale s of a group is (its largest representable value) / max(fmt):
             dequantize a copy of the QTensor whose codes all are the max code. Reported as
             log2 over the groups with a positive finite scale.

Which tensors (`select`): every float tensor ("all"); those `quantize_` /
`quantize_params` would quantize ("linear", `lowp inspect`'s default), the weights of
linear layers (rank 2, named `*weight`, not an embedding table); or the tensors whose
name a regular expression matches. A
tensor left out is listed with the reason.

A lowp file (written by `lowp.save`) holds quantized tensors: each is reported as it is
stored (scheme, groups, poisoned groups, codes at ±max, zero codes, scale range), not
quantized again; its `.codes`/`.scale` arrays are never mistaken for weights.

Printing lives in `lowp_apps.inspection_report`.
"""

import dataclasses
import math
import os
import pathlib
import re

import ml_dtypes
import numpy as np

import lowp
from lowp import extend
from lowp_apps import minilm
from lowp_apps.linear_weights import not_a_linear_weight

HP_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def preset_schemes(names: list[str] | None = None) -> dict[str, lowp.Scheme]:
    """The weight scheme of each named inference preset, keyed by preset name.

    `names=None`: every preset, keeping the first of presets sharing a weight scheme
    (float8_weight_only weighs like float8_rowwise). Explicit names are kept as given,
    duplicates dropped. An unknown name raises ValueError naming it.
    """
    chosen = lowp.InferenceConfig.names() if names is None else names
    out: dict[str, lowp.Scheme] = {}
    for name in chosen:
        weight = lowp.InferenceConfig.from_name(name).weight
        if name in out or (names is None and weight in out.values()):
            continue
        out[name] = weight
    return out


def default_model_path() -> pathlib.Path | None:
    """model.safetensors of all-MiniLM-L6-v2 (`minilm.model_dir`: $LOWP_MINILM_DIR or the
    package), or None if neither has it."""
    try:
        return minilm.model_dir() / "model.safetensors"
    except FileNotFoundError:
        return None


@dataclasses.dataclass(frozen=True)
class Row:
    """One (tensor, scheme) result. `not_applicable` holds the scheme's ValueError message
    when the scheme cannot quantize this tensor; the numbers are then None."""

    tensor: str
    shape: tuple[int, ...]
    hp_dtype: str
    scheme: str
    elements: int
    sqnr_db: float | None = None
    saturated: int | None = None
    flushed: int | None = None
    groups: int | None = None
    poisoned_groups: int | None = None
    scale_log2_min: float | None = None
    scale_log2_max: float | None = None
    not_applicable: str | None = None

    @property
    def saturated_fraction(self) -> float | None:
        return None if self.saturated is None else self.saturated / max(self.elements, 1)

    @property
    def flushed_fraction(self) -> float | None:
        return None if self.flushed is None else self.flushed / max(self.elements, 1)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A tensor left out: its dtype is not a float lowp quantizes, or the selection
    (`select`) did not take it."""

    tensor: str
    dtype: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Summary:
    """One scheme over the whole file. Fractions are of the elements of the tensors it
    applies to; median and worst SQNR leave out NaN (fully poisoned tensors)."""

    name: str
    scheme: lowp.Scheme
    tensors: int
    not_applicable: int
    elements: int
    median_sqnr_db: float | None
    worst_tensor: str | None
    worst_sqnr_db: float | None
    saturated_fraction: float | None
    flushed_fraction: float | None
    poisoned_groups: int


@dataclasses.dataclass(frozen=True)
class Stored:
    """A quantized tensor as a lowp file stores it. `at_max`: elements whose code is ±max
    (saturated, or exactly at a group's amax); `zeros`: elements whose code is ±0."""

    tensor: str
    shape: tuple[int, ...]
    hp_dtype: str
    scheme: lowp.Scheme
    elements: int
    groups: int
    poisoned_groups: int
    at_max: int
    zeros: int
    scale_log2_min: float | None
    scale_log2_max: float | None


@dataclasses.dataclass(frozen=True)
class Inspection:
    path: str
    tensors: int
    rows: list[Row]
    skipped: list[Skipped]
    summaries: list[Summary]
    stored: list[Stored] = dataclasses.field(default_factory=list)


def saturation_threshold(fmt: lowp.Format) -> tuple[float, bool]:
    """(max + ulp_top/2, whether that midpoint itself rounds up under ties-to-even)."""
    ulp_top = 2.0 ** (fmt.emax - fmt.mbits)
    max_is_odd = bool((fmt.max_mantissa >> (23 - fmt.mbits)) & 1)
    return fmt.max + ulp_top / 2, max_is_odd


def _max_codes(codes: np.ndarray, fmt: lowp.Format) -> np.ndarray:
    """An array shaped like the stored `codes` whose every element is the max code."""
    code = np.uint8(fmt.max_code)
    if fmt.name == "float4_e2m1fn":
        code = lowp.pack_fp4(np.array([code, code], dtype=np.uint8))[0]
    return np.full(codes.shape, code, dtype=np.uint8)


def inspect_tensor(name: str, x: np.ndarray, label: str, scheme: lowp.Scheme) -> Row:
    """Quantize `x` with `scheme` and measure it (see the module docstring).

    `x` must be float32, bfloat16 or float16. A scheme that cannot apply to `x`'s shape
    gives a Row whose `not_applicable` is the ValueError's message.
    """
    shape = tuple(int(n) for n in x.shape)
    common = {
        "tensor": name,
        "shape": shape,
        "hp_dtype": str(x.dtype),
        "scheme": label,
        "elements": x.size,
    }
    try:
        q = lowp.quantize(x, scheme, name=name)
    except ValueError as err:
        return Row(**common, not_applicable=str(err))
    fmt = extend.element_format(scheme.fmt)
    xf = x.astype(np.float32, copy=False).reshape(-1)
    y = lowp.dequantize(q, "float32").reshape(-1)
    group_max = lowp.dequantize(
        dataclasses.replace(q, codes=_max_codes(q.codes, fmt)), "float32"
    ).reshape(-1)
    poisoned = int(extend.poisoned_groups(q).sum())

    valid = None if poisoned == 0 else ~np.isnan(group_max)
    if valid is not None:  # poisoned groups stay out of the norms (and the scale range)
        xf, y, group_max = xf[valid], y[valid], group_max[valid]

    # 20·log10(‖x‖/‖e‖) = 10·log10(‖x‖²/‖e‖²), sums of squares in float64.
    x64 = xf.astype(np.float64)
    signal = float(np.dot(x64, x64))
    np.subtract(x64, y, out=x64)  # the error, reusing the buffer
    noise = float(np.dot(x64, x64))
    del x64
    if xf.size == 0 and x.size:  # every element poisoned: nothing measured, not exact
        sqnr = math.nan
    elif noise == 0:
        sqnr = math.inf
    elif signal == 0 or math.isinf(noise):  # an element dequantized to ±Inf (spec §6)
        sqnr = -math.inf
    else:
        sqnr = 10 * math.log10(signal / noise)

    flushed = int(np.count_nonzero((xf != 0) & (y == 0)))

    # |x|/s > T with s = group_max/max  <=>  |x|·max > T·group_max. Only elements with
    # |x| > group_max can qualify (T > max), a float32 compare that is exact; the few
    # candidates are then tested in float64, where both products are exact (<= 30 bits).
    # A zero-scale group (an NVFP4 block scale that rounds to 0) flushes, not saturates.
    threshold, midpoint_rounds_up = saturation_threshold(fmt)
    absx = np.abs(xf)
    candidates = np.flatnonzero((absx > group_max) & (group_max > 0))
    lhs = absx[candidates].astype(np.float64) * fmt.max
    rhs = group_max[candidates].astype(np.float64) * threshold
    saturated = int(np.count_nonzero((lhs >= rhs) if midpoint_rounds_up else (lhs > rhs)))

    lo = hi = None
    if group_max.size:
        gmin, gmax = float(group_max.min()), float(group_max.max())
        if gmin <= 0:
            positive = group_max[group_max > 0]
            gmin = float(positive.min()) if positive.size else math.nan
        if gmin > 0 and math.isfinite(gmax):
            lo, hi = math.log2(gmin / fmt.max), math.log2(gmax / fmt.max)
    return Row(
        **common,
        sqnr_db=sqnr,
        saturated=saturated,
        flushed=flushed,
        groups=int(q.scale.size),
        poisoned_groups=poisoned,
        scale_log2_min=lo,
        scale_log2_max=hi,
    )


def skip_reason(x: np.ndarray) -> str | None:
    """Why no scheme can quantize `x`, or None if its dtype is accepted."""
    if x.dtype in HP_DTYPES:
        return None
    # ml_dtypes' float8/bfloat16 dtypes have kind "V", so floats are recognised by name too.
    if x.dtype.kind != "f" and not x.dtype.name.startswith(("float", "bfloat")):
        return f"dtype {x.dtype} is not a float"
    return f"dtype {x.dtype} is not float32, bfloat16 or float16 (cast it first)"


def summarize(label: str, scheme: lowp.Scheme, rows: list[Row]) -> Summary:
    applied = [r for r in rows if r.scheme == label and r.not_applicable is None]
    na = sum(1 for r in rows if r.scheme == label and r.not_applicable is not None)
    measured = [r for r in applied if not math.isnan(r.sqnr_db)]
    worst = min(measured, key=lambda r: r.sqnr_db, default=None)
    elements = sum(r.elements for r in applied)
    return Summary(
        name=label,
        scheme=scheme,
        tensors=len(applied),
        not_applicable=na,
        elements=elements,
        median_sqnr_db=float(np.median([r.sqnr_db for r in measured])) if measured else None,
        worst_tensor=None if worst is None else worst.tensor,
        worst_sqnr_db=None if worst is None else worst.sqnr_db,
        saturated_fraction=sum(r.saturated for r in applied) / elements if elements else None,
        flushed_fraction=sum(r.flushed for r in applied) / elements if elements else None,
        poisoned_groups=sum(r.poisoned_groups for r in applied),
    )


def sort_key(row: Row):
    """Worst first: NaN SQNR (poisoned), then ascending SQNR, then the n/a rows."""
    if row.not_applicable is not None:
        return (2, 0.0, row.tensor)
    if math.isnan(row.sqnr_db):
        return (0, 0.0, row.tensor)
    return (1, row.sqnr_db, row.tensor)


def selection_reason(name: str, x: np.ndarray, select) -> str | None:
    """Why `select` leaves this float tensor out, or None if it takes it: "linear" (the
    tensors the presets quantize), "all", or a compiled regular expression searched in
    the name."""
    if select == "linear":
        return not_a_linear_weight(name, x)
    if select == "all":
        return None
    if isinstance(select, re.Pattern):
        return None if select.search(name) else f"name does not match --filter {select.pattern!r}"
    raise ValueError(f"select must be 'linear', 'all' or a compiled pattern, got {select!r}")


def stored_row(name: str, q: lowp.QTensor) -> Stored:
    """What a lowp file says of a quantized tensor, without the original to compare with."""
    fmt = extend.element_format(q.scheme.fmt)
    codes = q.codes if fmt.name != "float4_e2m1fn" else lowp.unpack_fp4(q.codes)
    magnitude = codes & np.uint8((1 << (fmt.bits - 1)) - 1)
    plain = q.with_scale_layout("plain")
    group_max = lowp.dequantize(
        dataclasses.replace(plain, codes=_max_codes(plain.codes, fmt)), "float32"
    )
    finite = group_max[np.isfinite(group_max) & (group_max > 0)]
    lo = hi = None
    if finite.size:
        lo = math.log2(float(finite.min()) / fmt.max)
        hi = math.log2(float(finite.max()) / fmt.max)
    return Stored(
        tensor=name,
        shape=q.shape,
        hp_dtype=q.hp_dtype,
        scheme=q.scheme,
        elements=int(np.prod(q.shape)),
        groups=int(plain.scale.size),
        poisoned_groups=int(extend.poisoned_groups(q).sum()),
        at_max=int(np.count_nonzero(magnitude == fmt.max_code)),
        zeros=int(np.count_nonzero(magnitude == 0)),
        scale_log2_min=lo,
        scale_log2_max=hi,
    )


def inspect_arrays(
    arrays: dict, schemes: dict, path: str = "<arrays>", progress=None, select="all"
) -> Inspection:
    """Inspect the tensors of `arrays` (name -> numpy array or lowp.QTensor) that `select`
    takes ("all", the default; "linear": what the presets quantize, `lowp inspect`'s
    default; or a compiled regular expression on the name) with every scheme of
    `schemes` (label -> Scheme); QTensors are reported as stored. `progress(done, total)` is called after each tensor."""
    rows: list[Row] = []
    skipped: list[Skipped] = []
    stored: list[Stored] = []
    total = len(arrays)
    for done, (name, x) in enumerate(arrays.items(), start=1):
        # A file's loader refuses these already; arrays built in memory may hold them.
        if (problem := extend.empty_span_problem(tuple(x.shape))) is not None:
            raise ValueError(f"{path}: tensor {name!r}: {problem}")
        if isinstance(x, lowp.QTensor):
            stored.append(stored_row(name, x))
        elif (reason := skip_reason(x) or selection_reason(name, x, select)) is not None:
            skipped.append(Skipped(name, str(x.dtype), reason))
        else:
            rows.extend(inspect_tensor(name, x, label, scheme) for label, scheme in schemes.items())
        if progress is not None:
            progress(done, total)
    rows.sort(key=sort_key)
    summaries = [summarize(label, scheme, rows) for label, scheme in schemes.items()]
    return Inspection(
        path=path, tensors=total, rows=rows, skipped=skipped, summaries=summaries, stored=stored
    )


def read_checkpoint(path) -> dict:
    """name -> numpy array or lowp.QTensor: a .safetensors file through `lowp.load` (a lowp
    file's quantized tensors come back whole), an .npz file's arrays."""
    if os.fspath(path).lower().endswith(".safetensors"):
        return lowp.load(path)
    return lowp.read_arrays(path)


def inspect_file(path, schemes: dict, progress=None, select="all") -> Inspection:
    """`inspect_arrays` over the tensors of a .safetensors or .npz file."""
    return inspect_arrays(
        read_checkpoint(path), schemes, path=str(path), progress=progress, select=select
    )
