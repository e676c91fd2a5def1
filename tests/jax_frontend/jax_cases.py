"""Cases and byte comparisons shared by test_conformance.py (CPU, pytest) and
gpu_conformance.py (whatever devices jax sees).

A case is a NumPy input; `run_case` quantizes it with `lowp` (the oracle) and with a
jitted `lowp_jax.quantize`, dequantizes both to float32, bfloat16 and float16, and
returns a description of every difference in bytes (empty when they agree).
"""

import functools
import math

import jax
import ml_dtypes
import numpy as np

import lowp
import lowp_jax
from lowp import _groups

ELEMENTS = list(lowp.ELEMENT_FORMATS)
OUT_DTYPES = ("float32", "bfloat16", "float16")
NP_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
SHAPES = {1: (48,), 2: (6, 16), 3: (2, 4, 8), 4: (2, 2, 3, 8)}
SEED, OFFSET = 2**32 + 12345, 7  # a seed above 2**32 checks the mod-2**32 rule


def schemes_for_rank(rank: int) -> list:
    """Every scheme kind x element format lowp admits for inputs of `rank` (blocks sized
    for SHAPES: the blocked axis holds 8 or more elements, so groups are several)."""
    out = []
    for fmt in ELEMENTS:
        out += [lowp.TensorScaling(fmt), lowp.TensorScaling(fmt, pow2=True)]
        out += [lowp.AxisScaling(fmt, axis=-1), lowp.AxisScaling(fmt, axis=0, pow2=True)]
        if rank >= 2:
            out += [
                lowp.BlockScaling(fmt, block=(2, 4)),
                lowp.BlockScaling(fmt, block=(3, 5), pow2=True),
            ]
        for mode in ("floor", "ceil", "rceil"):
            out.append(lowp.MXScaling(fmt, block=8, mode=mode))
        if fmt != "float4_e2m1fn" and rank >= 2:
            out.append(lowp.MXScaling(fmt, block=2, mode="rceil", axis=0))
    out += [lowp.NVFP4Scaling(block=8), lowp.NVFP4Scaling(block=8, global_scale=False)]
    return out


def scheme_id(scheme) -> str:
    fields = ",".join(f"{v}" for v in vars(scheme).values())
    return f"{type(scheme).__name__}({fields})"


# --- inputs ---------------------------------------------------------------------------


def group_ids(shape, scheme) -> np.ndarray:
    """The index of each element's group (flat index into the plain scale array)."""
    scale_shape = scheme.scale_shape(shape)
    ids = np.arange(math.prod(scale_shape), dtype=np.int64).reshape(scale_shape)
    return np.ascontiguousarray(_groups.expand(ids, scheme, shape))


def _leaders(ids: np.ndarray) -> np.ndarray:
    """Flat index of the first element of each non-empty group."""
    _, first = np.unique(ids.reshape(-1), return_index=True)
    return first


def _random_normal(shape, rng) -> np.ndarray:
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(
        -6, 6, size=shape[:-1] + (1,) if shape else ()
    )
    x = np.asarray(x)
    x[rng.random(shape) < 0.05] = 0.0
    x[rng.random(shape) < 0.02] = -0.0
    return x.astype(np.float32)


def _random_patterns(shape, rng, dtype=np.float32, exponents=None) -> np.ndarray:
    """Random finite patterns of `dtype` with every exponent (or those in `exponents`)."""
    if dtype == np.float32:
        b = rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32)
        if exponents is not None:
            e = rng.integers(exponents[0], exponents[1] + 1, size=shape).astype(np.uint32)
            b = (b & np.uint32(0x807FFFFF)) | (e << np.uint32(23))
        b = np.where((b & 0x7F800000) == 0x7F800000, b & np.uint32(0xBFFFFFFF), b)  # finite
        return b.astype(np.uint32).view(np.float32)
    b = rng.integers(0, 2**16, size=shape, dtype=np.uint32).astype(np.uint16)
    x = b.view(dtype)
    return np.where(np.isfinite(x.astype(np.float32)), x, dtype(1.5))


def edge_cases(shape, scheme, hp_dtype: str, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """(name, input) pairs for spec §6 and the rounding edges, all of `shape`, in hp_dtype."""
    rng = np.random.default_rng(seed)
    dtype = NP_DTYPES[hp_dtype]
    fmt = lowp.FORMATS[scheme.fmt]
    ids = group_ids(shape, scheme)
    leaders = _leaders(ids)
    size = math.prod(shape)
    cases = []

    def add(name, x):
        with np.errstate(over="ignore"):  # float16 turns huge values into Inf: fine, a case
            cases.append((name, np.asarray(x, np.float32).astype(dtype).reshape(shape)))

    add("random", _random_normal(shape, rng))
    zeros = np.zeros(size, np.float32)
    zeros[rng.random(size) < 0.5] = -0.0
    add("zeros", zeros)
    for bad in (np.nan, np.inf, -np.inf):
        x = _random_normal(shape, rng).reshape(-1)
        if size:
            x[rng.integers(size)] = bad
        add(f"non-finite {bad}", x)
    x = _random_normal(shape, rng).reshape(-1)
    if size:  # a non-finite element in every other group
        x[leaders[::2]] = np.array([np.nan, np.inf, -np.inf])[np.arange(len(leaders[::2])) % 3]
    add("non-finite in half the groups", x)

    # Ties of the element grid at scale 1: every group holds +-max, so m = 1 (float scales),
    # the MX byte is 127 (floor, rceil), and the other elements sit on midpoints.
    values = np.unique(np.abs(fmt.values()[np.isfinite(fmt.values())]))
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)
    pool = np.concatenate([mids, values])
    x = rng.choice(pool, size) * rng.choice([-1.0, 1.0], size)
    x[leaders] = fmt.max * rng.choice([-1.0, 1.0], len(leaders))
    add("grid ties at scale 1", x)
    # Just above max: 464 for e4m3, the tie between max and the next binade's step.
    step = 2.0 ** (fmt.emax - fmt.mbits)
    above = np.array(
        [fmt.max + step / 2, fmt.max, fmt.max - step / 2, fmt.max + step / 4], np.float64
    )
    x = rng.choice(above, size) * rng.choice([-1.0, 1.0], size)
    x[leaders] = fmt.max + step / 2
    add("max and the tie above it", x)

    # Group amax just below, at and above powers of two and max * 2**k, a random k per group.
    group_of = ids.reshape(-1)
    n_groups = math.prod(scheme.scale_shape(shape))
    for kind in (
        "below 2^k",
        "at 2^k",
        "above 2^k",
        "below max*2^k",
        "at max*2^k",
        "above max*2^k",
    ):
        base = 2.0 ** rng.integers(-30, 30, n_groups) * (fmt.max if "max" in kind else 1.0)
        peak = base.astype(np.float32)
        if kind.startswith("below"):
            peak = np.nextafter(peak, np.float32(0))
        elif kind.startswith("above"):
            peak = np.nextafter(peak, np.float32(np.inf))
        x = rng.uniform(-0.5, 0.5, size) * base[group_of]
        x[leaders] = peak[group_of[leaders]] * rng.choice([-1.0, 1.0], len(leaders))
        add(f"amax {kind}", x)

    sub = _random_patterns(shape, rng, exponents=(0, 0)).reshape(-1)
    x = _random_normal(shape, rng).reshape(-1)
    mask = rng.random(size) < 0.3
    x[mask] = sub[mask]
    add("float32 subnormals among normals", x)
    add("only float32 subnormals", sub)
    add("tiny normals 2^-126..2^-100", _random_patterns(shape, rng, exponents=(1, 27)))
    add("huge 2^100..2^128", _random_patterns(shape, rng, exponents=(227, 254)))
    add("random exponents", _random_patterns(shape, rng))
    if hp_dtype != "float32":  # every pattern of the narrower dtype, subnormals included
        cases.append(("random hp patterns", _random_patterns(shape, rng, dtype)))
    return cases


# --- exact arithmetic samples ------------------------------------------------------------


def ftz(x: np.ndarray) -> np.ndarray:
    """float32 subnormals replaced by the zero of their sign (spec §0.2), in NumPy."""
    b = np.asarray(x, np.float32).view(np.uint32)
    return np.where((b & 0x7F800000) == 0, b & 0x80000000, b).astype(np.uint32).view(np.float32)


def random_f32(rng, n) -> np.ndarray:
    """Random float32 patterns: every exponent, subnormals, Inf and NaN included."""
    return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def divide_pairs(rng, n):
    """n (a, b) pairs for the exact divide: random patterns, quotients within a few ulps of
    2**-126, 2**-127 and FLT_MAX (flush, subnormal rounding, overflow), significands equal
    or adjacent (the Ma < Mb doubling), and the formulas' numerators over random b."""
    a, b = random_f32(rng, n), random_f32(rng, n)
    k = n // 8
    for j, target in enumerate((2.0**-126, 2.0**-127, float(np.finfo(np.float32).max))):
        sl = slice(j * k, (j + 1) * k)
        bb = np.abs(ftz(b[sl]))
        bb = np.where((bb == 0) | ~np.isfinite(bb), np.float32(1.5), bb) * np.float32(2.0**-60)
        with np.errstate(all="ignore"):
            aa = (bb.astype(np.float64) * target).astype(np.float32)
        shift = rng.integers(-4, 5, k).astype(np.int64)
        aa = (
            (aa.view(np.uint32).astype(np.int64) + shift)
            .clip(0, 0x7F7FFFFF)
            .astype(np.uint32)
            .view(np.float32)
        )
        a[sl], b[sl] = aa, bb
    sl = slice(3 * k, 4 * k)
    b[sl] = np.abs(ftz(b[sl]))
    near = b[sl].view(np.uint32).astype(np.int64) + rng.integers(-2, 3, k)
    a[sl] = near.clip(0x00800000, 0x7F7FFFFF).astype(np.uint32).view(np.float32)
    sl = slice(4 * k, 5 * k)
    a[sl] = rng.choice(np.float32([448, 57344, 7.5, 28, 6, 2688, 1]), k)
    return a, b


def reference_divide(a, b) -> np.ndarray:
    with np.errstate(all="ignore"):
        return ftz(np.divide(ftz(a), ftz(b), dtype=np.float32))


def count_bit_differences(got, want) -> int:
    """Elements whose bits differ, NaNs of any payload counting as equal."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    return int((~same).sum())


# --- running and comparing -----------------------------------------------------------


@functools.cache
def jitted(scheme, rounding: str = "nearest", seed=None, offset=0, every_out_dtype=False):
    """One jitted quantize + dequantize per scheme and rounding (jax caches per shape/dtype).

    Dequantizes to the input's dtype, or with every_out_dtype to float32, bfloat16 and
    float16 (each output conversion adds compile time; the conversions themselves are
    scheme-independent). With rounding="stochastic" and seed=None the function takes
    the random bits as its second argument; an int seed is static, as a user's constant.
    """

    def run(x, random=None):
        if rounding == "nearest":
            q = lowp_jax.quantize(x, scheme)
        elif seed is None:
            q = lowp_jax.quantize(x, scheme, rounding="stochastic", random_bits=random)
        else:
            q = lowp_jax.quantize(x, scheme, rounding="stochastic", seed=seed, offset=offset)
        out_dtypes = OUT_DTYPES if every_out_dtype else (None,)
        return q, tuple(lowp_jax.dequantize(q, d) for d in out_dtypes)

    return jax.jit(run)


def reference(x, scheme, rounding="nearest", random=None, seed=None, offset=0):
    if rounding == "nearest":
        return lowp.quantize(x, scheme)
    if seed is None:
        return lowp.quantize(x, scheme, rounding="stochastic", random_bits=random)
    return lowp.quantize(x, scheme, rounding="stochastic", seed=seed, offset=offset)


def run_case(
    x,
    scheme,
    rounding="nearest",
    random=None,
    seed=None,
    offset=0,
    every_out_dtype=False,
    device=None,
) -> list[str]:
    """Differences between lowp and lowp_jax for input x (empty list: identical bytes)."""
    ref = reference(x, scheme, rounding, random, seed, offset)
    fn = jitted(scheme, rounding, seed, offset, every_out_dtype)
    args = (x,) if random is None else (x, random)
    if device is not None:
        args = jax.device_put(args, device)
    q, outs = fn(*args)
    got = lowp_jax.to_lowp(q)
    errors = compare_qtensors(x, ref, got)
    for out_dtype, out in zip(OUT_DTYPES if every_out_dtype else (None,), outs):
        want = lowp.dequantize(ref, out_dtype)
        errors += compare_arrays(f"dequantize->{want.dtype}", x, want, np.asarray(out))
    return errors


def _uint_view(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).reshape(-1)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def input_bits(x: np.ndarray, flat_index: int) -> str:
    v = _uint_view(x)[flat_index]
    return f"0x{int(v):0{2 * x.dtype.itemsize}X} ({x.reshape(-1)[flat_index]!r})"


def compare_arrays(what, x, want, got, element_of=lambda i: i) -> list[str]:
    """The first differing element of two arrays by bits, with its input's bits."""
    want_bits, got_bits = _uint_view(want), _uint_view(got)
    if want.shape != got.shape or want.dtype != got.dtype:
        return [f"{what}: shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"]
    diff = np.flatnonzero(want_bits != got_bits)
    if diff.size == 0:
        return []
    i = int(diff[0])
    index = np.unravel_index(i, want.shape) if want.ndim else ()
    j = element_of(i)
    where = tuple(int(n) for n in np.unravel_index(j, x.shape)) if x.size else ()
    first = tuple(int(n) for n in index)
    message = (
        f"{what}: {diff.size} of {want_bits.size} differ; first at {first}: "
        f"lowp 0x{int(want_bits[i]):X}, lowp_jax 0x{int(got_bits[i]):X}; "
        f"input element {where}: {input_bits(x, j)}"
    )
    return [message]


def compare_qtensors(x, ref: lowp.QTensor, got: lowp.QTensor) -> list[str]:
    errors = []
    for field in ("scheme", "shape", "hp_dtype", "scale_layout"):
        if getattr(ref, field) != getattr(got, field):
            errors.append(f"{field}: {getattr(got, field)!r} != {getattr(ref, field)!r}")
    if errors:
        return errors
    scheme = ref.scheme
    if scheme.fmt == "float4_e2m1fn":
        want, have = lowp.unpack_fp4(ref.codes), lowp.unpack_fp4(got.codes)
    else:
        want, have = ref.codes, got.codes
    errors += compare_arrays("codes", x, want, have)

    def amax_element(g):  # the element that sets group g's scale (computed on a mismatch only)
        members = np.flatnonzero(group_ids(ref.shape, scheme).reshape(-1) == g)
        magnitude = _uint_view(np.asarray(x, np.float32)) & np.uint32(0x7FFFFFFF)
        return int(members[np.argmax(magnitude[members])]) if members.size else 0

    plain_ref, plain_got = ref.with_scale_layout("plain"), got.with_scale_layout("plain")
    errors += compare_arrays("scale", x, plain_ref.scale, plain_got.scale, element_of=amax_element)
    if ref.scale_layout != "plain":  # the swizzled bytes themselves, padding included
        errors += compare_arrays("stored scale", x, ref.scale, got.scale, element_of=lambda i: 0)
    if (ref.global_scale is None) != (got.global_scale is None):
        errors.append(f"global_scale: {got.global_scale!r} != {ref.global_scale!r}")
    elif ref.global_scale is not None:
        errors += compare_arrays(
            "global_scale", x, ref.global_scale, got.global_scale, element_of=lambda i: 0
        )
    return errors


def describe(name, scheme, hp_dtype, errors) -> str:
    return f"{scheme_id(scheme)} {hp_dtype} case {name!r}:\n  " + "\n  ".join(errors)
