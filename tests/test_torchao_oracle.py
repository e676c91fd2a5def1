"""lowp's bytes against torchao 0.18's, on CPU: torchao is the oracle (spec §3.1, §3.2, §6).

Entry points (torchao 0.18.0):
  tensorwise float8: `torchao.float8.float8_scaling_utils.hp_tensor_to_float8_dynamic`
    (the float8 training cast: `tensor_to_scale` -> `hp_tensor_and_scale_to_float8`),
    whose `Float8TrainingTensor` holds `_data` (float8 codes) and `_scale` (the encode
    multiplier m; `_scale.reciprocal()` is the decode scale handed to `_scaled_mm`).
  MX: `torchao.prototype.mx_formats.mx_tensor.to_mx(x, elem_dtype, block_size,
    scaling_mode)` -> (e8m0 scales, element data); fp8 data is a float8 tensor, fp6 one
    unpacked code a byte, fp4 two codes a byte (low nibble first, as lowp).

Where torchao deliberately differs from the spec, the random tests generate data that
avoid the corner, assert that they did, and each corner has its own test below with
lowp's hand-derived bytes next to what torchao writes:
  POW2_JUST_BELOW     pow2 float scales: m just below 2^k; torchao's exp2(floor(log2(m)))
                      rounds up to 2^k, lowp clears mantissa bits (2^(k-1)).
  MX_ZERO_SCALE_BYTE  MX blocks with nonzero amax below 2^(emax-126): byte 0 means 2^-127,
                      but torchao FLOOR/CEIL divide by 2^-126 and RCEIL multiplies by 1.0
                      (RCEIL also rounds amax/max to a subnormal there, so it can write
                      byte 0 where the exact ceiling is 1).
  MX_NONFINITE        blocks with Inf (torchao: finite byte 255-emax, RCEIL 254) or NaN
                      (torchao: byte 255 too, but NaN element codes); lowp poisons (§6).
  MX_F32_SUBNORMAL    float32 subnormal inputs: lowp flushes them (§0.2), torchao scales them.
  MX_RCEIL_LOG2       RCEIL's CPU/eager fallback ceil(log2(RN32(amax/max))) loses the ceiling
                      when amax/max is a few ulps above a power of two: float32 log2 rounds
                      n + k*1.7e-7 down to n (measured: k up to 22 ulps, for |n| >= 64).
Everything else -- random data of ranks 1-4, float32 and bfloat16 inputs, magnitudes
1e-3..1e4, ties, saturation, all-zero tensors and blocks, every scale exponent -- must
match byte for byte.
"""

import ml_dtypes
import numpy as np
import pytest

import lowp

torch = pytest.importorskip("torch")
# The corners below pin torchao 0.18's behaviour; a later torchao may fix some of them.
pytest.importorskip("torchao", minversion="0.18")

from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
from torchao.float8.float8_training_tensor import LinearMMConfig
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
from torchao.prototype.mx_formats.mx_tensor import to_mx

FP8_FORMATS = ("float8_e4m3fn", "float8_e5m2")
MX_FORMATS = ("float8_e4m3fn", "float8_e5m2", "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")
MX_MODES = ("floor", "ceil", "rceil")
HP_DTYPES = ("float32", "bfloat16")
TORCH_FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
TORCHAO_ELEM = {
    **TORCH_FP8,
    "float6_e2m3fn": DTYPE_FP6_E2M3,
    "float6_e3m2fn": DTYPE_FP6_E3M2,
    "float4_e2m1fn": torch.float4_e2m1fn_x2,
}
TORCHAO_MODE = {
    "floor": ScaleCalculationMode.FLOOR,
    "ceil": ScaleCalculationMode.CEIL,
    "rceil": ScaleCalculationMode.RCEIL,
}
NP_HP = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
BLOCK = 32
EPS32 = np.float32(1e-12)  # 0x2B8CBCCC; torchao clamps amax at the float64 1e-12 instead
TENSOR_SHAPES = {1: (257,), 2: (33, 40), 3: (3, 17, 24), 4: (2, 3, 5, 16)}
MX_SHAPES = {1: (128,), 2: (6, 96), 3: (3, 4, 64), 4: (2, 3, 2, 64)}
# Ulps of m below 2^k (pow2) / of amax/max above 2^n (RCEIL) that torch's float32 log2
# rounds onto the integer: at most 44 / 22 over the whole float32 range (measured); 64 is margin.
LOG2_WINDOW_ULPS = 64


# ---------------------------------------------------------------- helpers


def _bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def _f32(b) -> np.ndarray:
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def _to_torch(x: np.ndarray) -> "torch.Tensor":
    if x.dtype == NP_HP["bfloat16"]:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(x, dtype=np.float32))


def _u8(t: "torch.Tensor") -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


def _assert_same_bytes(what: str, lowp_bytes, torchao_bytes) -> int:
    """Equal shapes and bytes, at least one compared; returns how many were compared."""
    got, want = np.asarray(lowp_bytes), np.asarray(torchao_bytes)
    assert got.shape == want.shape, f"{what}: lowp shape {got.shape}, torchao {want.shape}"
    assert got.size > 0, f"{what}: nothing compared"
    bad = got != want
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} differ; first at {i}: "
            f"lowp {int(got[i]):#x}, torchao {int(want[i]):#x}"
        )
    return got.size


def _torchao_tensorwise(x: np.ndarray, fmt: str, pow2: bool):
    """torchao's float8 training cast: (codes, m, d = m.reciprocal()) as numpy."""
    t = hp_tensor_to_float8_dynamic(
        _to_torch(x), TORCH_FP8[fmt], LinearMMConfig(), round_scales_to_power_of_2=pow2
    )
    m = t._scale
    assert m.dtype == torch.float32 and m.numel() == 1
    return _u8(t._data), np.float32(m.item()), np.float32(m.reciprocal().item())


def _torchao_mx(x: np.ndarray, fmt: str, mode: str):
    """(e8m0 scale bytes, element bytes) of torchao's `to_mx` along the last axis."""
    scale, data = to_mx(_to_torch(x), TORCHAO_ELEM[fmt], BLOCK, TORCHAO_MODE[mode])
    return _u8(scale), _u8(data)


def _compare_tensorwise(x: np.ndarray, fmt: str, pow2: bool) -> int:
    q = lowp.quantize(x, lowp.TensorScaling(fmt, pow2=pow2))
    codes, _, d = _torchao_tensorwise(x, fmt, pow2)
    n = _assert_same_bytes(f"{fmt} pow2={pow2} codes", q.codes, codes)
    _assert_same_bytes(f"{fmt} pow2={pow2} decode scale", _bits(q.scale), _bits(d))
    return n


def _compare_mx(x: np.ndarray, fmt: str, mode: str) -> int:
    q = lowp.quantize(x, lowp.MXScaling(fmt, block=BLOCK, mode=mode))
    scale, data = _torchao_mx(x, fmt, mode)
    _assert_same_bytes(f"MX {fmt} {mode} scale bytes", q.scale, scale)
    return _assert_same_bytes(f"MX {fmt} {mode} element codes", q.codes, data)


def _true_m(amax: np.ndarray, fmt: str) -> np.ndarray:
    """RN32(max / max(amax, EPS)) before any power-of-two rounding (spec §3.1)."""
    fmax = np.float32(lowp.FORMATS[fmt].max)
    return np.divide(fmax, np.maximum(np.float32(amax), EPS32), dtype=np.float32)


def _pow2_just_below(m: np.ndarray) -> np.ndarray:
    """POW2_JUST_BELOW: m within LOG2_WINDOW_ULPS ulps below a power of two (not one itself)."""
    mant = _bits(m) & 0x7FFFFF
    return (mant != 0) & (0x800000 - mant <= LOG2_WINDOW_ULPS)


def _mx_corners(x: np.ndarray, fmt: str, mode: str) -> dict:
    """Per block (last axis in blocks of 32), the corners where torchao differs by design."""
    b = _bits(np.asarray(x, dtype=np.float32))
    b = b.reshape(b.shape[:-1] + (b.shape[-1] // BLOCK, BLOCK)) & 0x7FFFFFFF
    amax = b.max(axis=-1)
    finite_amax = _f32(np.where(amax >= 0x7F800000, 0, amax))
    emax = lowp.FORMATS[fmt].emax
    corners = {
        "MX_ZERO_SCALE_BYTE": (amax > 0) & (finite_amax < np.float32(2.0 ** (emax - 126))),
        "MX_NONFINITE": amax >= 0x7F800000,
        "MX_F32_SUBNORMAL": ((b > 0) & (b < 0x00800000)).any(axis=-1),
        "MX_RCEIL_LOG2": np.zeros(amax.shape, bool),
    }
    if mode == "rceil":
        descale = np.divide(finite_amax, np.float32(lowp.FORMATS[fmt].max), dtype=np.float32)
        mant = _bits(descale) & 0x7FFFFF
        normal = _bits(descale) >= 0x00800000
        corners["MX_RCEIL_LOG2"] = normal & (mant > 0) & (mant <= LOG2_WINDOW_ULPS)
    return corners


def _random(rng, shape, magnitude=None) -> np.ndarray:
    """Gaussian float32 data times `magnitude`, or by default times magnitudes log-uniform
    in 1e-3..1e4, one per 32-block (one per element if 32 doesn't divide the size).

    A few exact zeros and negative zeros are sprinkled in; nothing subnormal.
    """
    x = rng.standard_normal(shape).astype(np.float32)
    if magnitude is None:
        group = BLOCK if x.size % BLOCK == 0 else 1
        spread = 10.0 ** rng.uniform(-3, 4, x.size // group)
        x = (x.reshape(-1, group) * spread[:, None]).reshape(shape)
    else:
        x = x * magnitude
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 4)] = 0.0
    flat[rng.integers(0, flat.size, 4)] = -0.0
    return flat.reshape(shape).astype(np.float32)


def _cast(x: np.ndarray, hp: str) -> np.ndarray:
    return x.astype(NP_HP[hp])


# ---------------------------------------------------------------- tensorwise, pow2=False


@pytest.mark.parametrize("rank", sorted(TENSOR_SHAPES))
@pytest.mark.parametrize("hp", HP_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_tensorwise_random_matches_torchao(fmt, hp, rank):
    rng = np.random.default_rng([rank, len(fmt), len(hp)])
    shape = TENSOR_SHAPES[rank]
    compared = 0
    for magnitude in (1e-3, 1e-1, 1.0, 1e2, 1e4, None):
        x = _cast(_random(rng, shape, magnitude), hp)
        compared += _compare_tensorwise(x, fmt, pow2=False)
    assert compared == 6 * int(np.prod(shape))


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_tensorwise_ties_and_saturation_match_torchao(fmt):
    """amax = max gives m = 1, so every midpoint of the format is an exact tie; then the
    tie between max and the next binade step (464 / 61440), and max's neighbours."""
    spec = lowp.FORMATS[fmt]
    values = spec.values()[: spec.max_code + 1]  # +0 .. +max, finite
    ties = (values[:-1].astype(np.float64) + values[1:]) / 2
    assert np.all(ties == ties.astype(np.float32)), "midpoints must be exact in float32"
    x = np.concatenate([values, ties, -values, -ties]).astype(np.float32)
    q = lowp.quantize(x, lowp.TensorScaling(fmt))
    assert float(q.scale) == 1.0
    assert _compare_tensorwise(x, fmt, pow2=False) == x.size
    # Hand-derived ties to even: e4m3 432 (416|448) -> 448, 400 (384|416) -> 384,
    # 2^-10 (0|2^-9) -> +0, -2^-10 -> -0; e5m2 53248 (49152 = 0x7A | 57344 = 0x7B) -> 0x7A,
    # 2^-17 (0|2^-16) -> +0.
    hand = {
        "float8_e4m3fn": {432.0: 0x7E, 400.0: 0x7C, 2.0**-10: 0x00, -(2.0**-10): 0x80},
        "float8_e5m2": {53248.0: 0x7A, 2.0**-17: 0x00, -(2.0**-17): 0x80},
    }[fmt]
    for value, code in hand.items():
        assert abs(value) in ties, value  # each hand value is a midpoint
        assert q.codes[np.flatnonzero(x == np.float32(value))[0]] == code, value

    above = {"float8_e4m3fn": 464.0, "float8_e5m2": 61440.0}[fmt]  # tie with the next step
    fmax = np.float32(spec.max)
    for amax in (above, np.nextafter(fmax, np.float32(np.inf)), np.nextafter(fmax, np.float32(0))):
        x = np.array([amax, -amax, amax / 2, 1.0, -0.0, 0.0], np.float32)
        assert _compare_tensorwise(x, fmt, pow2=False) == x.size
        assert lowp.quantize(x, lowp.TensorScaling(fmt)).codes[0] == spec.max_code


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_tensorwise_all_zero_and_eps_match_torchao(fmt):
    """torchao clamps amax at the float64 1e-12, lowp at float32(1e-12) = 0x2B8CBCCC,
    which is 4e-22 smaller: still the same m, for zero, tiny and subnormal-only tensors."""
    assert float(EPS32) < 1e-12
    eps_bits = int(_bits(EPS32))
    tensors = [
        np.zeros(16, np.float32),
        np.full(16, -0.0, np.float32),
        np.array([1e-13, -1e-13, 0.0], np.float32),
        np.array([1e-40, -3e-39, 0.0], np.float32),  # float32 subnormals: lowp flushes
        _f32([eps_bits, eps_bits - 1, 0]),
        _f32([eps_bits + 1, eps_bits, 0]),
    ]
    # m = RN32(max / 1e-12), hand-checked: 448e12 -> 0x57CBBA10, 57344e12 -> 0x5B4BBA10.
    m_bits = {"float8_e4m3fn": 0x57CBBA10, "float8_e5m2": 0x5B4BBA10}[fmt]
    for x in tensors:
        assert _compare_tensorwise(x, fmt, pow2=False) == x.size
    for i, x in enumerate(tensors[:5]):  # amax <= EPS32: both use the EPS floor
        _, m, _ = _torchao_tensorwise(x, fmt, pow2=False)
        assert int(_bits(m)) == m_bits
        q = lowp.quantize(x, lowp.TensorScaling(fmt))
        assert q.scale == np.divide(np.float32(1), _f32(m_bits), dtype=np.float32)
        if i in (0, 1, 3):  # zeros, and subnormals (flushed; x*m < 2^-77 anyway)
            assert np.all((q.codes & 0x7F) == 0)


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_tensorwise_amax_near_powers_of_two_matches_torchao(fmt):
    compared = 0
    for k in range(-40, 41):
        p = int(_bits(np.float32(2.0**k)))
        for amax in _f32([p - 1, p, p + 1]):
            x = np.array([amax, -amax * np.float32(0.3), amax / 1000, 0.0, -amax], np.float32)
            compared += _compare_tensorwise(x, fmt, pow2=False)
    assert compared == 81 * 3 * 5


# ---------------------------------------------------------------- tensorwise, pow2=True


@pytest.mark.parametrize("hp", HP_DTYPES)
@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_pow2_random_matches_torchao(fmt, hp):
    """Away from POW2_JUST_BELOW, clearing mantissa bits == exp2(floor(log2(m)))."""
    rng = np.random.default_rng([7, len(fmt), len(hp)])
    compared = 0
    for shape in TENSOR_SHAPES.values():
        for magnitude in (1e-3, 0.37, 1.0, 55.0, 1e4, None):
            x = _cast(_random(rng, shape, magnitude), hp)
            amax = np.abs(x.astype(np.float32)).max()
            # POW2_JUST_BELOW: nudge the rare random draw off it, then make sure.
            if _pow2_just_below(_true_m(amax, fmt)):
                x = _cast(x.astype(np.float32) * np.float32(1.5), hp)
                amax = np.abs(x.astype(np.float32)).max()
            assert not _pow2_just_below(_true_m(amax, fmt))
            compared += _compare_tensorwise(x, fmt, pow2=True)
    assert compared == 6 * sum(int(np.prod(s)) for s in TENSOR_SHAPES.values())


@pytest.mark.parametrize("fmt", FP8_FORMATS)
def test_pow2_sweep_differs_only_just_below_powers_of_two(fmt):
    """amax within 4 ulps of max * 2^-k for every k: agreement except POW2_JUST_BELOW,
    where torchao's m is exactly twice lowp's, and that corner does occur."""
    fmax = lowp.FORMATS[fmt].max
    agreed = corner = 0
    for k in range(-40, 41):
        base = int(_bits(np.float32(fmax * 2.0**-k)))
        for amax in _f32(np.arange(base - 4, base + 5)):
            x = np.array([amax, -amax / 3, amax / 100, 0.0], np.float32)
            m_true = _true_m(amax, fmt)
            q = lowp.quantize(x, lowp.TensorScaling(fmt, pow2=True))
            lowp_m = np.divide(np.float32(1), q.scale, dtype=np.float32)
            assert int(_bits(lowp_m)) & 0x7FFFFF == 0 and lowp_m <= m_true < 2 * lowp_m
            if _pow2_just_below(m_true):
                _, ao_m, _ = _torchao_tensorwise(x, fmt, pow2=True)
                if ao_m != lowp_m:
                    assert ao_m == 2 * lowp_m > m_true
                    corner += 1
                    continue
            _compare_tensorwise(x, fmt, pow2=True)
            agreed += 1
    assert corner > 0 and agreed > 0 and corner + agreed == 81 * 9


def test_pow2_corner_m_just_below_power_of_two():
    """POW2_JUST_BELOW: amax = nextafter(3.5, inf) = 0x40600001, e4m3.

    m = RN32(448 / amax) = 0x42FFFFFF = 128 - 2^-17. lowp clears the mantissa: m = 64,
    d = 2^-6 = 0x3C800000; amax*64 = 224.00002 -> 224 = 0x76, 1.0*64 -> 0x68.
    torchao: log2(m) rounds to 7.0 in float32, so m = 128 > max/amax; amax*128 =
    448.00003 saturates to 0x7E and 1.0*128 -> 0x70.
    """
    amax = _f32(0x40600001)
    assert amax == np.nextafter(np.float32(3.5), np.float32(np.inf))
    m_true = _true_m(amax, "float8_e4m3fn")
    assert int(_bits(m_true)) == 0x42FFFFFF
    x = np.array([amax, 1.0], np.float32)
    q = lowp.quantize(x, lowp.TensorScaling("float8_e4m3fn", pow2=True))
    assert int(_bits(q.scale)) == 0x3C800000
    assert q.codes.tolist() == [0x76, 0x68]
    lowp_m = np.divide(np.float32(1), q.scale, dtype=np.float32)
    assert lowp_m == 64 and lowp_m <= m_true  # a power of two, not above the true m
    codes, ao_m, ao_d = _torchao_tensorwise(x, "float8_e4m3fn", pow2=True)
    assert ao_m == 128 and ao_m > m_true and ao_d == np.float32(2.0**-7)
    assert codes.tolist() == [0x7E, 0x70]


# ---------------------------------------------------------------- MX


def _random_mx(rng, shape, fmt, mode, hp) -> np.ndarray:
    """Random blocks (one all-zero block where there is room) that avoid every corner."""
    x = _random(rng, shape)
    if x.size >= 4 * BLOCK:
        flat = x.reshape(-1, BLOCK)
        flat[1] = 0.0
        flat[1, ::2] = -0.0
        x = flat.reshape(shape)
    x = _cast(x, hp)
    for _ in range(4):  # MX_RCEIL_LOG2 hits ~1 random float32 block in 10^5: move it off
        hit = _mx_corners(x, fmt, mode)["MX_RCEIL_LOG2"]
        if not hit.any():
            break
        nudge = np.where(np.repeat(hit, BLOCK, axis=-1), np.float32(1.5), np.float32(1))
        x = _cast(x.astype(np.float32) * nudge, hp)
    for name, mask in _mx_corners(x, fmt, mode).items():
        assert not mask.any(), f"random data hit {name}"
    return x


@pytest.mark.parametrize("rank", sorted(MX_SHAPES))
@pytest.mark.parametrize("hp", HP_DTYPES)
@pytest.mark.parametrize("mode", MX_MODES)
@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_random_matches_torchao(fmt, mode, hp, rank):
    rng = np.random.default_rng([rank, MX_FORMATS.index(fmt), MX_MODES.index(mode), len(hp)])
    shape = MX_SHAPES[rank]
    compared = 0
    for _ in range(3):
        compared += _compare_mx(_random_mx(rng, shape, fmt, mode, hp), fmt, mode)
    per_byte = 2 if fmt == "float4_e2m1fn" else 1
    assert compared == 3 * int(np.prod(shape)) // per_byte


@pytest.mark.parametrize("mode", MX_MODES)
@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_every_scale_exponent_matches_torchao_outside_corners(fmt, mode):
    """One block per float32 amax exponent 1..254 times mantissas around 0 and Mc:
    every block outside the named corners matches; the floor clamp path is exercised."""
    spec = lowp.FORMATS[fmt]
    mc = spec.max_mantissa
    mantissas = {0, 1, 2, 22, 23, 64, 65, mc - 1, mc, mc + 1, mc + 2, mc + 22, mc + 23}
    mantissas |= {mc + 64, mc + 65, 0x7FFFFE, 0x7FFFFF}
    exps = np.arange(1, 255, dtype=np.uint32)
    mant = np.array(sorted(m for m in mantissas if m <= 0x7FFFFF), np.uint32)
    amax = _f32(((exps[:, None] << 23) | mant[None, :]).reshape(-1))
    fractions = np.array([1, -0.75, 0.3, 2.0**-10, -(2.0**-20), 0.0, -0.0], np.float32)
    fractions = np.concatenate([fractions, np.linspace(-0.99, 0.99, BLOCK - 7, dtype=np.float32)])
    x = (amax[:, None] * fractions[None, :]).astype(np.float32)
    x[np.abs(x) < np.float32(2.0**-126)] *= 0  # keep off MX_F32_SUBNORMAL (sign kept)

    corners = _mx_corners(x, fmt, mode)
    excluded = np.zeros(len(x), bool)
    for mask in corners.values():
        excluded |= mask.reshape(-1)
    keep = ~excluded
    assert not corners["MX_NONFINITE"].any() and not corners["MX_F32_SUBNORMAL"].any()
    assert corners["MX_ZERO_SCALE_BYTE"].any()
    assert keep.sum() > 0.5 * len(x)

    q = lowp.quantize(x, lowp.MXScaling(fmt, block=BLOCK, mode=mode))
    scale, data = _torchao_mx(x, fmt, mode)
    _assert_same_bytes("scale bytes", q.scale.reshape(-1)[keep], scale.reshape(-1)[keep])
    _assert_same_bytes("element codes", q.codes[keep], data[keep])
    if mode == "floor":  # blocks whose amax exceeds max * 2^(s-127) saturate
        s = q.scale.reshape(-1).astype(np.int64)
        saturated = keep & (amax.astype(np.float64) * 2.0 ** (127 - s) > spec.max)
        assert saturated.sum() > 100


@pytest.mark.parametrize("mode", MX_MODES)
@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_mx_all_zero_block_matches_torchao(fmt, mode):
    """Not a corner: an all-zero block gets byte 0 from both, and its zeros keep their sign."""
    x = np.zeros((2, BLOCK), np.float32)
    x[:, 1::2] = -0.0
    scale, data = _torchao_mx(x, fmt, mode)
    q = lowp.quantize(x, lowp.MXScaling(fmt, mode=mode))
    sign = 1 << (lowp.FORMATS[fmt].ebits + lowp.FORMATS[fmt].mbits)
    want = np.tile(np.array([0, sign], np.uint8), (2, BLOCK // 2))
    if fmt == "float4_e2m1fn":
        want = lowp.pack_fp4(want)  # low nibble +0, high nibble -0: 0x80
        assert want[0, 0] == 0x80
    assert q.scale.tolist() == [[0], [0]] and np.array_equal(q.codes, want)
    _assert_same_bytes("scale bytes", q.scale, scale)
    _assert_same_bytes("element codes", q.codes, data)


def _block(*values) -> np.ndarray:
    x = np.zeros(BLOCK, np.float32)
    x[: len(values)] = values
    return x


@pytest.mark.parametrize("mode", MX_MODES)
def test_mx_corner_zero_scale_byte(mode):
    """MX_ZERO_SCALE_BYTE: e4m3 block [2^-120, -2^-121, 0...], amax < 2^(8-126).

    lowp: byte 0 (E(amax) = 7 <= emax 8), elements x * 2^127: 128 -> 0x70, -64 -> 0xE8,
    which dequantize back exactly. torchao writes byte 0 too, but FLOOR/CEIL divide by
    2^-126 (64 -> 0x68, -32 -> 0xE0) and RCEIL multiplies by 1.0 (underflow: 0x00, 0x80).
    """
    x = _block(2.0**-120, -(2.0**-121))
    assert _mx_corners(x, "float8_e4m3fn", mode)["MX_ZERO_SCALE_BYTE"].all()
    q = lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode=mode))
    assert q.scale.tolist() == [0]
    assert q.codes[:3].tolist() == [0x70, 0xE8, 0x00]
    assert np.array_equal(lowp.dequantize(q), x)
    scale, data = _torchao_mx(x, "float8_e4m3fn", mode)
    assert scale.tolist() == [0]
    assert data[:3].tolist() == ([0x00, 0x80, 0x00] if mode == "rceil" else [0x68, 0xE0, 0x00])


def test_mx_corner_zero_scale_byte_rceil_subnormal_quotient():
    """MX_ZERO_SCALE_BYTE, RCEIL flavour: amax = 0x04600001 = max * 2^-127 * (1 + 2^-23/1.75).

    lowp: E = 8, M = 0x600001 > Mc -> byte 1; amax * 2^126 = 224.00002 -> 0x76.
    torchao: amax/448 rounds to the subnormal 2^-127, log2 gives -127 -> byte 0,
    then multiplies by 1.0 -> 0x00.
    """
    x = _block(_f32(0x04600001))
    assert _mx_corners(x, "float8_e4m3fn", "rceil")["MX_ZERO_SCALE_BYTE"].all()
    q = lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode="rceil"))
    assert q.scale.tolist() == [1] and q.codes[0] == 0x76
    scale, data = _torchao_mx(x, "float8_e4m3fn", "rceil")
    assert scale.tolist() == [0] and data[0] == 0x00


@pytest.mark.parametrize("mode", MX_MODES)
def test_mx_corner_inf_block(mode):
    """MX_NONFINITE (Inf): e4m3 block [inf, 1, -2, 0...].

    lowp poisons (§6): byte 0xFF, every code 0. torchao writes a finite byte, 255 - emax
    = 247 (FLOOR/CEIL, from Inf's exponent field) or 254 (RCEIL), saturates Inf to 448
    (0x7E) and scales 1 and -2 to zeros (0x00, 0x80).
    """
    x = _block(np.inf, 1.0, -2.0)
    assert _mx_corners(x, "float8_e4m3fn", mode)["MX_NONFINITE"].all()
    q = lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode=mode))
    assert q.scale.tolist() == [0xFF] and not q.codes.any()
    scale, data = _torchao_mx(x, "float8_e4m3fn", mode)
    assert scale.tolist() == [254 if mode == "rceil" else 247]
    assert data[:3].tolist() == [0x7E, 0x00, 0x80]


@pytest.mark.parametrize("mode", MX_MODES)
def test_mx_corner_nan_block(mode):
    """MX_NONFINITE (NaN): e4m3 block [nan, 1, -2, 0...]. Both write byte 0xFF; lowp's
    codes are all 0 (§6), torchao's NaN element becomes 0x7F (FLOOR/CEIL: 1 and -2 divided
    by an Inf scale give 0x00, 0x80; RCEIL multiplies every element by NaN: all 0x7F)."""
    x = _block(np.nan, 1.0, -2.0)
    assert _mx_corners(x, "float8_e4m3fn", mode)["MX_NONFINITE"].all()
    q = lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode=mode))
    assert q.scale.tolist() == [0xFF] and not q.codes.any()
    scale, data = _torchao_mx(x, "float8_e4m3fn", mode)
    assert scale.tolist() == [0xFF]
    if mode == "rceil":
        assert np.all(data == 0x7F)
    else:
        assert data[:4].tolist() == [0x7F, 0x00, 0x80, 0x00]


@pytest.mark.parametrize("mode", MX_MODES)
def test_mx_corner_float32_subnormal_input(mode):
    """MX_F32_SUBNORMAL: e4m3 block [2^-115, 2^-127, -2^-127, 0...] (2^-127 is subnormal).

    Both: byte 4 (E(2^-115) = 12, mantissa 0, 12 - 8), 2^-115 * 2^123 = 256 -> 0x78.
    lowp flushes the subnormals to +-0 (0x00, 0x80); torchao scales them to 2^-4 (0x18, 0x98).
    """
    x = _block(2.0**-115, 2.0**-127, -(2.0**-127))
    assert _mx_corners(x, "float8_e4m3fn", mode)["MX_F32_SUBNORMAL"].all()
    q = lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode=mode))
    assert q.scale.tolist() == [4] and q.codes[:4].tolist() == [0x78, 0x00, 0x80, 0x00]
    scale, data = _torchao_mx(x, "float8_e4m3fn", mode)
    assert scale.tolist() == [4] and data[:4].tolist() == [0x78, 0x18, 0x98, 0x00]


def test_mx_corner_rceil_log2_fallback():
    """MX_RCEIL_LOG2: amax = 0x48E00001 = 448 * 2^10 + 1 ulp, e4m3.

    lowp: E = 145, M = 0x600001 > Mc -> byte 145 + 1 - 8 = 138 (the exact ceiling of
    log2(amax/448) = 10 + 1.7e-7 is 11); amax * 2^-11 = 224.00002 -> 0x76.
    torchao RCEIL eager/CPU: amax/448 = 1024 * (1 + 2^-23), float32 log2 = 10.0 exactly,
    ceil 10 -> byte 137; amax * 2^-10 = 448.00004 saturates to 0x7E. FLOOR agrees (137).
    """
    x = _block(_f32(0x48E00001), 1.0)
    assert _mx_corners(x, "float8_e4m3fn", "rceil")["MX_RCEIL_LOG2"].all()
    q = lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode="rceil"))
    assert q.scale.tolist() == [138] and q.codes[0] == 0x76
    scale, data = _torchao_mx(x, "float8_e4m3fn", "rceil")
    assert scale.tolist() == [137] and data[0] == 0x7E
    assert _compare_mx(x, "float8_e4m3fn", "floor") == BLOCK
    assert lowp.quantize(x, lowp.MXScaling("float8_e4m3fn", mode="floor")).scale.tolist() == [137]
