"""GEMM conformance (spec §7): every quantized GEMM path of a backend against the exact
float64 product of the reference's dequantized operands.

Accumulation order differs between cuBLAS, XLA and CPUs, so GEMMs are bounded, not
bit-exact: every path must reach SQNR >= 40 dB (output rounding alone gives ~59 dB in
bfloat16, so a lost factor of 2, a wrong scale or a transposed operand fails), and a
path without fast accumulation must also keep every element within
`ulp_out(y_exact) + K * 2^-23 * sum_k |a_ik b_kj|`.

The cases are every inference preset (weight-only ones with a high-precision
activation) and every quantized GEMM of every training recipe, operands stored with
the reduction axis last as lowp's recipes write them; GEMMs that compute the same
thing (the same schemes at the same shapes) are run once under all their names.
The paths: lowp_torch.scaled_matmul with each kernel that can run (and weight-only
`F.linear`), compiled where the backend compiles; lowp_jax.dot_general with each impl
that can run. A path that cannot run says why, and is reported, not failed.
"""

import dataclasses
import zlib

import ml_dtypes
import numpy as np

import lowp

SQNR_DB = 40.0
M, K, N = 64, 256, 128  # K divides every preset's blocks; M, N, K fit every kernel's alignment


@dataclasses.dataclass(frozen=True)
class GemmCase:
    """`a @ b.T` with a (rows, R) and b (cols, R), both scaled along R (their last axis).

    Attributes:
      names: the presets and recipe GEMMs this case stands for.
      a, b: the operand schemes; a None is a high-precision activation (weight-only).
      a_shape, b_shape: the operand shapes.
      fast_accum: whether one of those GEMMs runs with fast accumulation (spec §8's
        forward GEMMs): such paths are also run fast, and checked by SQNR only.
    """

    names: tuple[str, ...]
    a: lowp.Scheme | None
    b: lowp.Scheme
    a_shape: tuple[int, int]
    b_shape: tuple[int, int]
    fast_accum: bool

    @property
    def id(self) -> str:
        return "+".join(self.names)


def gemm_cases() -> list[GemmCase]:
    """Every inference preset and every quantized recipe GEMM, merged where identical."""
    shapes = {"forward": ((M, K), (N, K)), "dgrad": ((M, N), (K, N)), "wgrad": ((N, M), (K, M))}
    found = {}

    def add(name, a, b, role, fast_accum):
        key = (a, b) + shapes[role]
        names, fast = found.get(key, ((), False))
        found[key] = (names + (name,), fast or fast_accum)

    for preset in lowp.InferenceConfig.names():
        config = lowp.InferenceConfig.from_name(preset)
        add(f"preset:{preset}", config.activation, config.weight, "forward", True)
    for recipe_name in lowp.Recipe.names():
        recipe = lowp.Recipe.from_name(recipe_name)
        for role in shapes:
            spec = getattr(recipe, role)
            if not spec.high_precision:
                add(f"recipe:{recipe_name}.{role}", spec.a, spec.b, role, spec.fast_accum)
    return [
        GemmCase(names, a, b, a_shape, b_shape, fast)
        for (a, b, a_shape, b_shape), (names, fast) in found.items()
    ]


def operands(case: GemmCase) -> tuple[np.ndarray, np.ndarray]:
    """float32 operands: normal values with per-row magnitudes 2^-3 .. 2^3 (so per-row
    scales matter) and an all-zero row in a (its outputs must be zeros, not NaN)."""
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    a = rng.standard_normal(case.a_shape) * np.exp2(rng.integers(-3, 4, (case.a_shape[0], 1)))
    b = rng.standard_normal(case.b_shape) / np.sqrt(case.b_shape[1])
    a[3] = 0.0
    return a.astype(np.float32), b.astype(np.float32)


def exact_operands(case: GemmCase, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference's dequantized operands in float64 (a itself where it is not quantized)."""

    def values(x, scheme):
        if scheme is None:
            return x.astype(np.float64)
        return lowp.dequantize(lowp.quantize(x, scheme), "float32").astype(np.float64)

    return values(a, case.a), values(b, case.b)


def sqnr_db(y: np.ndarray, exact: np.ndarray) -> float:
    """20 log10(|exact| / |exact - y|) over all elements, in float64 (inf when equal)."""
    err = np.linalg.norm(exact - np.asarray(y, np.float64))
    return float("inf") if err == 0 else float(20 * np.log10(np.linalg.norm(exact) / err))


def problems(y, a64: np.ndarray, b64: np.ndarray, bounded: bool) -> list[str]:
    """How output `y` of a path breaks spec §7 ([] when it does not): the SQNR floor,
    and with `bounded` the elementwise bound in y's own dtype."""
    y = np.asarray(y)
    exact = a64 @ b64.T
    out = []
    if y.shape != exact.shape:
        return [f"output shape {y.shape}, want {exact.shape}"]
    db = sqnr_db(y, exact)
    if not db >= SQNR_DB:
        out.append(f"SQNR {db:.1f} dB < {SQNR_DB:.0f} dB")
    if bounded:
        info = ml_dtypes.finfo(y.dtype)
        magnitude = np.maximum(np.abs(exact), float(info.smallest_normal))
        ulp = np.exp2(np.floor(np.log2(magnitude)) - info.nmant)
        bound = ulp + a64.shape[1] * 2.0**-23 * (np.abs(a64) @ np.abs(b64).T)
        excess = np.abs(np.asarray(y, np.float64) - exact) - bound
        if excess.max(initial=0) > 0:
            i = np.unravel_index(int(np.argmax(excess)), excess.shape)
            out.append(
                f"bound exceeded at {tuple(int(n) for n in i)}: y={float(y[i])!r}, "
                f"exact={float(exact[i])!r}, bound={float(bound[i]):.3g}"
            )
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class PathResult:
    """One path's output for a case, or why it cannot run (y None)."""

    path: str
    y: np.ndarray | None
    bounded: bool  # no fast accumulation: the elementwise bound applies
    reason: str = ""


def torch_paths(case: GemmCase, a: np.ndarray, b: np.ndarray, device: str, compiled: bool):
    """lowp_torch's GEMM paths for `case`: scaled_matmul with every kernel (emulated in
    float32 out, the fp8 kernels in bfloat16, which they all write), or `F.linear` with
    the quantized weight for weight-only presets; under torch.compile if `compiled`."""
    import torch

    import lowp_torch

    def call(fn, *args):
        # Eagerly first: a kernel that cannot run raises its ValueError there (under
        # torch.compile it would surface as dynamo's Unsupported).
        y = fn(*args)
        return torch.compile(fn, fullgraph=True)(*args) if compiled else y

    def host(y):
        y = y.detach().cpu()
        return (
            y.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            if y.dtype == torch.bfloat16
            else y.numpy()
        )

    at, bt = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
    qb = lowp_torch.quantize(bt, case.b)
    if case.a is None:
        y = call(torch.nn.functional.linear, at, qb)
        return [PathResult("F.linear(weight-only)", host(y), bounded=True)]
    qa = lowp_torch.quantize(at, case.a)
    out = []
    for kernel in ("emulated", "scaled_mm", "fbgemm"):
        out_dtype = torch.float32 if kernel == "emulated" else torch.bfloat16
        for fast in sorted({False, case.fast_accum and kernel != "emulated"}):

            def gemm(qa, qb, kernel=kernel, fast=fast, out_dtype=out_dtype):
                return lowp_torch.scaled_matmul(
                    qa, qb, kernel=kernel, fast_accum=fast, out_dtype=out_dtype
                )

            name = f"scaled_matmul[{kernel}{', fast_accum' if fast else ''}]"
            try:
                y = call(gemm, qa, qb)
            except ValueError as err:
                if "cannot run this GEMM" not in str(err):
                    raise
                out.append(
                    PathResult(name, None, bounded=False, reason=str(err).split(": ", 2)[-1])
                )
                break
            out.append(PathResult(name, host(y), bounded=not fast))
    return out


def jax_paths(case: GemmCase, a: np.ndarray, b: np.ndarray, device):
    """lowp_jax.dot_general with every impl at Precision.HIGHEST, and for fast-accumulation
    GEMMs on a GPU also at the default precision, where Hopper accumulates fp8 fast and
    float32 in TF32 (on a CPU both precisions compute the same float32 dot)."""
    import jax
    from jax import lax

    import lowp
    import lowp_jax

    dims = (((1,), (1,)), ((), ()))
    out = []
    with jax.default_device(device):
        aj, bj = jax.device_put((a, b), device)
        if case.a is None:
            lhs, rhs = aj, bj
            config = lowp.InferenceConfig(weight=case.b, activation=None)
        else:
            lhs, rhs = lowp_jax.quantize(aj, case.a), lowp_jax.quantize(bj, case.b)
            config = None
        for impl in ("emulated", "dequantize", "fp8", "scaled_matmul"):
            fast_too = case.fast_accum and device.platform == "gpu"
            precisions = [lax.Precision.HIGHEST] + ([None] if fast_too else [])
            for precision in precisions:
                fast = precision is None
                name = f"dot_general[{impl}{', default precision' if fast else ''}]"
                try:
                    y = lowp_jax.dot_general(lhs, rhs, dims, precision, config=config, impl=impl)
                except ValueError as err:
                    if "cannot run these operands" not in str(err):
                        raise
                    out.append(
                        PathResult(name, None, bounded=False, reason=str(err).split(": ", 2)[-1])
                    )
                    break
                out.append(PathResult(name, np.asarray(y), bounded=not fast))
    return out
