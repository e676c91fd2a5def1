"""Conformance cases and the byte comparison, shared by test_torch_conformance.py and
gpu_conformance.py.

A case is (scheme, input shape, edge case, input dtype, rounding). `run_roundtrip`
quantizes and dequantizes with lowp_torch (eagerly or through a compiled function) and
`compare` checks codes, scales, the global scale and the dequantized output byte for
byte against the NumPy reference `lowp`; a mismatch is described by its first
differing element, that element's input float32 bits, and both outputs.
"""

import dataclasses
import math
import zlib

import ml_dtypes
import numpy as np
import torch

import lowp
import lowp_torch
from lowp import _groups

ELEMENTS = list(lowp.ELEMENT_FORMATS)
MX_MODES = ("floor", "ceil", "rceil")
SHAPES = {1: (64,), 2: (6, 32), 3: (2, 3, 32), 4: (2, 2, 2, 32)}
# One zero-sized dim in a different place per rank; every scheme of that rank admits it.
EMPTY_SHAPES = {1: (0,), 2: (6, 0), 3: (2, 0, 32), 4: (2, 2, 0, 32)}
EDGE_CASES = ("random", "zeros", "nan", "inf", "ties", "pow2", "subnormal", "huge", "tiny")
VARIANTS = {"pow2": 3}  # more than one input for the cases whose amax list is long
HP_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
F32 = np.float32


def schemes_for_rank(rank: int) -> list:
    """Every scheme x element format lowp admits for inputs of `rank` (SHAPES[rank])."""
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
    out += [lowp.MXScaling(), lowp.NVFP4Scaling(), lowp.NVFP4Scaling(global_scale=False)]
    out.append(lowp.NVFP4Scaling(block=8))
    return out


def scheme_id(scheme) -> str:
    """A short readable id: TensorScaling(fmt='float8_e4m3fn', pow2=False) -> Tensor-e4m3fn."""
    kind = type(scheme).__name__.replace("Scaling", "")
    parts = [kind, scheme.fmt.replace("float8_", "").replace("float6_", "").replace("float4_", "")]
    for field in dataclasses.fields(scheme):
        if field.name == "fmt":
            continue
        value = getattr(scheme, field.name)
        if value != field.default:
            parts.append(f"{field.name}={value}")
    return "-".join(str(p).replace(" ", "") for p in parts)


# ---------------------------------------------------------------------------------------
# Inputs


def _next(v, toward) -> F32:
    return np.nextafter(F32(v), F32(toward))


def _positive_values(fmt: str) -> np.ndarray:
    values = lowp.ELEMENT_FORMATS[fmt].values()
    finite = values[np.isfinite(values) & (values > 0)]
    return np.unique(finite.astype(np.float64))


def group_ids(shape, scheme) -> np.ndarray:
    """Each element's group number (flat index into the plain scale array)."""
    scale_shape = scheme.scale_shape(tuple(shape))
    ids = np.arange(math.prod(scale_shape), dtype=np.int64).reshape(scale_shape)
    return np.ascontiguousarray(np.broadcast_to(_groups.expand(ids, scheme, tuple(shape)), shape))


def _per_group(shape, scheme, amaxes, rng, variant, fill=None) -> np.ndarray:
    """Each group gets amax amaxes[k] (cycling, shifted by variant) at its first element
    and values fill * amax elsewhere (fill: uniform in (-1, 1) unless given)."""
    ids = group_ids(shape, scheme).reshape(-1)
    amaxes = np.asarray(amaxes, dtype=np.float64)
    amax = amaxes[(ids + 7 * variant) % len(amaxes)]
    fill = rng.uniform(-1, 1, ids.size) if fill is None else fill
    x = (amax * fill).astype(F32)
    _, first = np.unique(ids, return_index=True)
    signs = np.where(rng.random(first.size) < 0.5, -1.0, 1.0)
    x[first] = (amax[first] * signs).astype(F32)
    return x.reshape(shape)


def _random(shape, rng) -> np.ndarray:
    """Normal data across magnitudes per row (last axis), with exact zeros."""
    lead = tuple(shape[:-1]) + (1,)
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, size=lead)
    x[rng.random(shape) < 0.05] = 0.0
    return x.astype(F32)


def make_input(case: str, shape, scheme, variant: int = 0) -> np.ndarray:
    """float32 input of `shape` for edge case `case` (spec §6 and the boundaries of §3)."""
    shape = tuple(shape)
    rng = np.random.default_rng(zlib.crc32(f"{case}/{shape}/{variant}/{scheme}".encode()))
    n = math.prod(shape)
    fmt = lowp.ELEMENT_FORMATS[scheme.fmt]
    if n == 0:
        return np.zeros(shape, F32)
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
    if case == "ties":
        # Scale 1 (float scales: m = max/max; MX floor/rceil: byte 127) and every element
        # on a code or halfway between two, including 464 for e4m3 (the tie above 448).
        values = _positive_values(scheme.fmt)
        above = values[-1] + (values[-1] - values[-2]) / 2
        grid = np.concatenate([values, (values[:-1] + values[1:]) / 2, [above, 0.0]])
        fill = rng.choice(grid, n) * np.where(rng.random(n) < 0.5, -1, 1) / fmt.max
        return _per_group(shape, scheme, [fmt.max, above], rng, variant, fill)
    if case == "pow2":
        # Group amax just below, at and just above powers of two and max * 2**k.
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
    if case == "huge":
        flt_max = np.finfo(F32).max
        amaxes = [flt_max, _next(flt_max, 0), F32(2.0**127), F32(1e38), F32(1e30), F32(6e37)]
        return _per_group(shape, scheme, amaxes, rng, variant)
    if case == "tiny":
        # Float scales' EPS floor (1e-12) from both sides; NVFP4's S_enc overflow.
        eps = F32(1e-12)
        amaxes = [
            F32(1e-30),
            F32(1e-37),
            F32(2.0**-126),
            F32(1.5e-38),
            eps,
            _next(eps, 0),
            _next(eps, 1),
        ]
        return _per_group(shape, scheme, amaxes, rng, variant)
    raise ValueError(f"unknown edge case {case!r}")


def random_magnitudes(shape, seed: int, chunk: int | None = None) -> np.ndarray:
    """Random float32 over 1e-30 .. 1e30, random signs, 1% zeros.

    chunk=None: each element's magnitude is log-uniform. chunk=k: each run of k
    elements along the last axis shares a log-uniform magnitude (times 10**U(-2, 0)
    per element), so group maxima, and so the quotients of the scale formulas, spread
    over the whole range too.
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


def to_torch(x32: np.ndarray, hp_dtype: str, device) -> torch.Tensor:
    return torch.from_numpy(x32.copy()).to(HP_DTYPES[hp_dtype]).to(device)


def to_reference_input(t: torch.Tensor) -> np.ndarray:
    """The numpy array lowp.quantize gets for `t` (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---------------------------------------------------------------------------------------
# Running and comparing


def rounding_kwargs(rounding: str, seed: int = 0) -> dict:
    if rounding == "nearest":
        return {}
    if rounding == "stochastic":
        return {"rounding": "stochastic", "seed": 1234 + seed, "offset": 77 * seed}
    raise ValueError(rounding)


def eager_roundtrip(scheme, kwargs):
    """t -> (QuantizedTensor, dequantized tensor), the function tests run or compile."""

    def roundtrip(t):
        q = lowp_torch.quantize(t, scheme, **kwargs)
        return q, lowp_torch.dequantize(q)

    return roundtrip


def compiled_roundtrip(scheme, kwargs, fullgraph=True):
    """The roundtrip under torch.compile: static shapes, the whole thing one graph."""
    return torch.compile(eager_roundtrip(scheme, kwargs), dynamic=False, fullgraph=fullgraph)


def _as_uint(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _input_note(x32: np.ndarray, index) -> str:
    v = x32[index]
    return f"input[{tuple(int(i) for i in index)}] = 0x{int(v.view(np.uint32)):08x} ({float(v)!r})"


def first_difference(label, got, want, x32, scheme, role) -> str | None:
    """None if `got` and `want` hold identical bytes, else the first difference explained.

    role: "elements" (shaped like the input), "packed" (fp4 codes, two a byte),
    "scale" (plain scale shape: the group's largest input is shown), "global".
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype.itemsize != want.dtype.itemsize:
        return f"{label}: got shape {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    g, w = _as_uint(got), _as_uint(want)
    differ = g != w
    if not differ.any():
        return None
    index = tuple(int(i) for i in np.argwhere(differ)[0])
    digits = 2 * got.dtype.itemsize
    text = (
        f"{label}: {int(differ.sum())} of {differ.size} differ; first at index {index}: "
        f"got 0x{int(g[index]):0{digits}x}, want 0x{int(w[index]):0{digits}x}"
    )
    if role == "elements":
        notes = [_input_note(x32, index)]
    elif role == "packed":
        lead, j = index[:-1], index[-1]
        notes = [_input_note(x32, lead + (2 * j,)), _input_note(x32, lead + (2 * j + 1,))]
    elif role in ("scale", "global"):
        ids = group_ids(x32.shape, scheme) if role == "scale" else np.zeros(x32.shape, np.int64)
        flat = int(np.ravel_multi_index(index, got.shape)) if got.ndim else 0
        members = np.argwhere(ids == flat)
        absb = np.abs(x32).view(np.uint32)[tuple(members.T)]
        top = tuple(members[int(np.argmax(absb))])
        notes = [f"group of {len(members)}, largest |x| at " + _input_note(x32, top)]
    else:
        return text
    return text + "; " + "; ".join(notes)


def _reference_dequantized(ref, out_dtype: str) -> np.ndarray:
    # A code times its scale may round past FLT_MAX to Inf (a group amax near FLT_MAX
    # whose block maximum rounds up), as spec §3 says; lowp's NumPy multiply then warns,
    # which the project's filterwarnings turns into an error. The value is right.
    with np.errstate(over="ignore"):
        return lowp.dequantize(ref, out_dtype)


def compare(q, out, ref, x32, scheme, label="") -> list[str]:
    """Differences between lowp_torch's (q, dequantized out) and lowp's QTensor `ref`."""
    problems = []
    mine = lowp_torch.to_lowp(q)
    packed = scheme.fmt == "float4_e2m1fn"
    checks = [
        ("codes", mine.codes, ref.codes, "packed" if packed else "elements"),
        ("scale", mine.scale, ref.scale, "scale"),
    ]
    for name, got, want, role in checks:
        problem = first_difference(f"{label}{name}", got, want, x32, scheme, role)
        if problem:
            problems.append(problem)
    if (mine.global_scale is None) != (ref.global_scale is None):
        problems.append(f"{label}global_scale: got {mine.global_scale}, want {ref.global_scale}")
    elif ref.global_scale is not None:
        problem = first_difference(
            f"{label}global_scale", mine.global_scale, ref.global_scale, x32, scheme, "global"
        )
        if problem:
            problems.append(problem)
    if q.hp_dtype != HP_DTYPES[ref.hp_dtype] or q.shape != ref.shape:
        problems.append(
            f"{label}metadata: got {q.shape} {q.hp_dtype}, want {ref.shape} {ref.hp_dtype}"
        )
    want_out = _reference_dequantized(ref, ref.hp_dtype)
    got_out = _to_numpy(out)
    problem = first_difference(f"{label}dequantize", got_out, want_out, x32, scheme, "elements")
    if problem:
        problems.append(problem)
    return problems


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def extra_checks(q, ref, x32, scheme, label="") -> list[str]:
    """Eager-only checks: every out_dtype, from_lowp round trips, the cuBLAS layout."""
    problems = []
    for out_dtype, torch_dtype in HP_DTYPES.items():
        got = _to_numpy(lowp_torch.dequantize(q, torch_dtype))
        want = _reference_dequantized(ref, out_dtype)
        problems.append(
            first_difference(f"{label}dequantize->{out_dtype}", got, want, x32, scheme, "elements")
        )
    back = lowp_torch.from_lowp(ref, device=q.device)
    problems.append(
        first_difference(
            f"{label}dequantize(from_lowp(ref))",
            _to_numpy(back.dequantize()),
            _reference_dequantized(ref, ref.hp_dtype),
            x32,
            scheme,
            "elements",
        )
    )
    again = lowp_torch.to_lowp(back)
    for name in ("codes", "scale"):
        problems.append(
            first_difference(
                f"{label}to_lowp(from_lowp(ref)).{name}",
                getattr(again, name),
                getattr(ref, name),
                x32,
                scheme,
                None,
            )
        )
    if _blockable(scheme, q.shape):
        blocked = q.with_scale_layout("cublas_blocked")
        want = ref.with_scale_layout("cublas_blocked")
        got = lowp_torch.to_lowp(blocked)
        problems.append(
            first_difference(
                f"{label}cublas_blocked scale", got.scale, want.scale, x32, scheme, None
            )
        )
        problems.append(
            first_difference(
                f"{label}dequantize(cublas_blocked)",
                _to_numpy(blocked.dequantize()),
                _reference_dequantized(want, ref.hp_dtype),
                x32,
                scheme,
                "elements",
            )
        )
        plain = lowp_torch.to_lowp(blocked.with_scale_layout("plain"))
        problems.append(
            first_difference(
                f"{label}cublas_blocked -> plain", plain.scale, ref.scale, x32, scheme, None
            )
        )
    return [p for p in problems if p]


def _blockable(scheme, shape) -> bool:
    if not isinstance(scheme, (lowp.MXScaling, lowp.NVFP4Scaling)) or len(shape) == 0:
        return False
    return scheme.axis % len(shape) == len(shape) - 1


def check_case(
    roundtrip, scheme, x32, hp_dtype, kwargs, device, *, extras=False, label=""
) -> list[str]:
    """Quantize x32 (as hp_dtype on device) through `roundtrip`, compare with lowp."""
    t = to_torch(x32, hp_dtype, device)
    ref = lowp.quantize(to_reference_input(t), scheme, **kwargs)
    q, out = roundtrip(t)
    x_as_f32 = t.detach().float().cpu().numpy()  # the float32 the input converts to, exactly
    problems = compare(q, out, ref, x_as_f32, scheme, label)
    if extras:
        problems += extra_checks(q, ref, x_as_f32, scheme, label)
    return problems
