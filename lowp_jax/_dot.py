"""`dot_general` on quantized operands: `x @ w.T` with x (..., K) and w (N, K), lowered
to the fastest XLA computation that keeps spec §7's bound.

Every operand is brought to one layout before anything else: the contracting axis K
last, the right operand a rank-2 (N, K) weight ("K-major", what cuBLASLt's fp8 GEMM
reads without a transpose). A high-precision operand is quantized in that layout, so
its groups always run along K (spec §8); a QArray must already be quantized along its
contracting axis. Then one branch of `_forward` computes the product:

- "fp8": float8 codes of tensorwise / rowwise (AxisScaling along K) operands straight
  into `lax.dot_general`, which XLA on Hopper rewrites into cuBLASLt's fp8 GEMM
  (`__cublas$lt$matmul$f8`): it writes float32, multiplied by the per-tensor or per-row
  (M) x per-column (N) decode scales, then rounded once to the output dtype; or, for
  two tensorwise operands, a bfloat16 output, a large enough product and fast
  accumulation (or power-of-two scales), it writes bfloat16 with the scalar scale folded
  into the GEMM (`_fp8_dot`). The activation is reshaped to (M, K): XLA's fp8
  rewrite takes one non-contracting dim per operand.
- "scaled_matmul": MX (fp8 or fp4 elements, 32-blocks) and NVFP4 operands through
  `jax.nn.scaled_matmul`, which runs cuDNN's block-scaled GEMM on Blackwell (compute
  capability >= 10.0, cuDNN >= 9.7). NVFP4's per-tensor scales multiply the output.
- "dequantize": both operands dequantized to the compute dtype (bfloat16 in a bfloat16
  model: one more rounding of each operand, within spec §7's 40 dB but not its
  elementwise bound), then an ordinary dot accumulating in float32, as fast as the
  high-precision model's. What the GPU runs for BlockScaling (its scales change along
  K inside one GEMM; XLA offers no blockwise-scaled fp8 GEMM on Hopper), float6, weight-
  only configs, and MX/NVFP4 where scaled_matmul has no kernel.
- "emulated": dequantize to float32, dot in float32 at Precision.HIGHEST, round once.
  Every scheme pair on every backend; what `impl="auto"` runs off the GPU.

Gradients are straight-through: the derivative with respect to a high-precision
operand is that of the dot of the dequantized operands, with the quantization taken as
the identity (as `lowp_jax.fake_quantize` does). QArray operands get no gradient. This
is an inference dot; the training recipes (quantized dgrad and wgrad) are not this.
"""

import dataclasses
import functools
import logging
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import lowp
from lowp import extend
from lowp_jax import _devices, _encode, _layouts, _qarray, _quantize, _switches
from lowp_jax import _dot_operands as _operands

logger = logging.getLogger("lowp_jax")

IMPLS = ("auto", "fp8", "scaled_matmul", "dequantize", "emulated")
_FP8 = ("float8_e4m3fn", "float8_e5m2")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one call: hashable, a nondiff argument of the custom JVP."""

    impl: str  # as requested ("auto" or a name from IMPLS)
    lhs_scheme: lowp.Scheme | None  # the scheme a high-precision lhs is quantized with
    rhs_scheme: lowp.Scheme | None
    precision: object
    out_dtype: np.dtype
    out_sharding: object = None  # of the 2-D product, as lax.dot_general's (training GEMMs)


def dot_general(
    lhs,
    rhs,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    *,
    config: lowp.InferenceConfig | None = None,
    impl: str = "auto",
    out_sharding=None,
) -> jax.Array:
    """`lax.dot_general` with quantized operands: the product of `lhs` (..., K) and a
    rank-2 weight `rhs`, contracting one axis of each.

    Args:
      lhs: the activation, any rank >= 1: a QArray quantized along the contracting axis
        (its last), or a float32 / bfloat16 / float16 array, quantized here with
        `config.activation` (left in high precision when that is None: weight-only).
      rhs: the weight, rank 2: a QArray quantized along its contracting axis, or a
        high-precision array quantized here with `config.weight`. (N, K), contracting
        axis 1, is the layout the fp8 GEMM reads directly; a (K, N) array (flax's
        kernel, contracting axis 0) is transposed to (N, K) first, so its groups still
        run along K, never along N.
      dimension_numbers: `((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))`
        as for `lax.dot_general`, with one contracting axis each and no batch axes.
      precision: passed to the underlying dot ("fp8", "dequantize"). On Hopper the
        default precision lets cuBLASLt use its fast fp8 accumulation, as spec §8's
        forward GEMMs do; `lax.Precision.HIGHEST` asks for the exact one.
      preferred_element_type: the output dtype; default the promotion of the operands'
        high-precision dtypes (a QArray counts as its `hp_dtype`).
      config: the `lowp.InferenceConfig` (or its preset name, "float8_rowwise" say)
        whose schemes quantize high-precision operands; needed only when one is given.
      impl: "auto" (the default: off the GPU "emulated"; on a GPU the first of "fp8",
        "scaled_matmul", "dequantize" that can run, the choice and the reasons for
        skipping the others logged at DEBUG on the "lowp_jax" logger), or one of those
        names to force it (ValueError saying why, if it cannot run these operands).
      out_sharding: the product's sharding, as for `lax.dot_general` (under a mesh with
        Explicit axes, where a sharded contracting dim needs it); a rank-2 lhs only.

    Returns:
      The lhs free dims followed by N, as `lax.dot_general`, in the output dtype.

    Raises:
      ValueError: naming the dim or operand: contracted sizes that differ, batch dims,
        more than one contracting axis, an rhs not of rank 2, a QArray quantized along
        another axis than the contracting one, a scheme that cannot quantize the
        operand (a block that does not divide K), or an impl that cannot run.
      TypeError: a high-precision operand and no config.

    >>> import jax.numpy as jnp, lowp, lowp_jax
    >>> x, w = jnp.ones((2, 64)), jnp.full((64, 3), 0.5)  # flax kernel layout (K, N)
    >>> cfg = lowp.InferenceConfig.from_name("float8_rowwise")
    >>> lowp_jax.dot_general(x, w, (((1,), (0,)), ((), ())), config=cfg).tolist()
    [[32.0, 32.0, 32.0], [32.0, 32.0, 32.0]]
    """
    a, b, plan = _prepare(
        lhs, rhs, dimension_numbers, precision, preferred_element_type, config, impl
    )
    if out_sharding is not None:
        if a.ndim != 2:
            raise NotImplementedError(
                f"dot_general: out_sharding is taken for a rank-2 lhs, got shape {a.shape}"
            )
        plan = dataclasses.replace(plan, out_sharding=out_sharding)
    return _dot(a, b, plan)


def dot_general_impl(
    lhs, rhs, dimension_numbers, *, config: lowp.InferenceConfig | None = None, impl: str = "auto"
) -> tuple[str, str]:
    """(impl, reason): which branch `dot_general` would run for these operands on the
    default backend, and why. Arrays may be `jax.ShapeDtypeStruct`s: nothing is computed."""

    def operands(lhs, rhs):
        a, b, plan = _prepare(lhs, rhs, dimension_numbers, None, None, config, impl)
        return _operand(a, plan.lhs_scheme), _operand(b, plan.rhs_scheme)

    return _choose(*jax.eval_shape(operands, lhs, rhs), impl)


def scaled_matmul_problem(device=None) -> str | None:
    """Why `jax.nn.scaled_matmul` cannot run a block-scaled GEMM on `device` (default:
    jax's default device), or None if it can (a CUDA GPU of compute capability >= 10.0
    with cuDNN >= 9.7)."""
    device = jax.devices()[0] if device is None else device
    capability = _devices.cuda_capability(device)
    if capability is None:
        return (
            f"jax.nn.scaled_matmul has a kernel only on CUDA GPUs (cuDNN); the "
            f"device is {device.platform} ({device.device_kind})"
        )
    if capability < (10, 0):
        return (
            f"cuDNN's block-scaled GEMM needs compute capability >= 10.0 (Blackwell); "
            f"{device.device_kind} is {'.'.join(map(str, capability))}"
        )
    try:
        from jax._src.lib import cuda_versions  # private: no public accessor in jax 0.10-0.11

        cudnn = cuda_versions.cudnn_get_version()
    except Exception as e:  # noqa: BLE001 - any failure means "cannot tell"
        return f"cannot read the cuDNN version ({type(e).__name__}: {e})"
    if cudnn < 90700:
        return f"jax.nn.scaled_matmul needs cuDNN >= 9.7, found {cudnn}"
    return None


# --- the operands, in the one layout -------------------------------------------------


def _prepare(lhs, rhs, dimension_numbers, precision, preferred_element_type, config, impl):
    """Check everything, bring both operands to (..., K) and (N, K), build the plan."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if isinstance(config, str):
        config = lowp.InferenceConfig.from_name(config)
    if config is not None and not isinstance(config, lowp.InferenceConfig):
        raise TypeError(f"config must be a lowp.InferenceConfig or a preset name, got {config!r}")
    lc, rc = _operands.contracting_dims(
        dimension_numbers, _operands.shape_of(lhs), _operands.shape_of(rhs)
    )
    if isinstance(rhs, _qarray.QArray):
        _operands.check_quantized_along(rhs, rc, "rhs")
        b = rhs if rc == 1 else _operands.transpose(rhs)
        rhs_scheme = None
    else:
        b = _operands.hp(rhs, "rhs")
        b = b if rc == 1 else b.T
        rhs_scheme = _operands.scheme_for(config, "weight", b.shape, "rhs")
    if isinstance(lhs, _qarray.QArray):
        _operands.check_quantized_along(lhs, lc, "lhs")
        if lc != lhs.ndim - 1:
            raise ValueError(
                f"lhs: a QArray lhs must contract its last axis, got axis {lc} of shape "
                f"{lhs.shape}; quantize it with the contracting axis last"
            )
        a, lhs_scheme = lhs, None
    else:
        a = _operands.hp(lhs, "lhs")
        a = a if lc == a.ndim - 1 else jnp.moveaxis(a, lc, -1)
        lhs_scheme = _operands.scheme_for(config, "activation", a.shape, "lhs")
    out_dtype = (
        jnp.dtype(preferred_element_type)
        if preferred_element_type is not None
        else jnp.result_type(_operands.hp_dtype(a), _operands.hp_dtype(b))
    )
    return a, b, _Plan(impl, lhs_scheme, rhs_scheme, precision, np.dtype(out_dtype))


# --- choosing the branch ---------------------------------------------------------------


def _operand(x, scheme):
    """The operand as the dot sees it: a QArray, or a high-precision array (weight-only)."""
    if scheme is None:
        return x
    return _quantize.quantize(x, scheme)


def _device(a, b):
    """The device the dot runs on: that of the operands where they are concrete arrays
    on one device (eagerly, `jax.device_put(x, cpu)` on a GPU machine runs on the CPU);
    under `jit`, where operands are tracers, jax's default device, which is where the
    computation compiles for unless its inputs are committed elsewhere."""
    for x in (a, b):
        leaf = x.codes if isinstance(x, _qarray.QArray) else x
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            devices = leaf.devices()
            if len(devices) == 1:
                return next(iter(devices))
    default = jax.config.jax_default_device  # set by `with jax.default_device(...)`
    if isinstance(default, str):
        return jax.devices(default)[0]
    return default if default is not None else jax.devices()[0]


def _problem(impl: str, a, b) -> str | None:
    """Why `impl` cannot run operands a (..., K) and b (N, K), or None if it can."""
    qa, qb = isinstance(a, _qarray.QArray), isinstance(b, _qarray.QArray)
    device = _device(a, b)
    gpu = device.platform == "gpu"
    if impl in ("dequantize", "emulated"):
        return None
    if not (qa and qb):
        return "one operand is in high precision (weight-only): nothing to feed a quantized GEMM"
    sa, sb = a.scheme, b.scheme
    if impl == "fp8":
        for s in (sa, sb):
            if isinstance(s, lowp.BlockScaling):
                return (
                    f"{s} scales change along K inside the GEMM, so they cannot be applied to "
                    "its output, and XLA has no blockwise-scaled fp8 GEMM on Hopper"
                )
            if not isinstance(s, (lowp.TensorScaling, lowp.AxisScaling)):
                return f"{type(s).__name__} is block-scaled (scales inside the K loop): not an fp8 GEMM"
            if s.fmt not in _FP8:
                return f"{s.fmt} has no fp8 GEMM"
        if gpu and sa.fmt == sb.fmt == "float8_e5m2":
            return "cuBLASLt's fp8 GEMM needs one e4m3 operand; both are float8_e5m2"
        if gpu:
            capability = _devices.cuda_capability(device)
            if capability is None or capability < (8, 9):
                return f"XLA's fp8 GEMM needs a CUDA GPU of compute capability >= 8.9, not {device.device_kind}"
        return None
    if impl == "scaled_matmul":
        mx = isinstance(sa, lowp.MXScaling) and isinstance(sb, lowp.MXScaling)
        nv = isinstance(sa, lowp.NVFP4Scaling) and isinstance(sb, lowp.NVFP4Scaling)
        if not (mx or nv):
            return f"jax.nn.scaled_matmul takes MX x MX or NVFP4 x NVFP4 operands, got {sa} x {sb}"
        if mx and not (
            sa.block == sb.block == 32
            and (sa.fmt in _FP8 and sb.fmt in _FP8 or sa.fmt == sb.fmt == "float4_e2m1fn")
        ):
            return f"cuDNN's MX GEMM takes 32-blocks of fp8 x fp8 or fp4 x fp4, got {sa} x {sb}"
        if nv and not sa.block == sb.block == 16:
            return f"cuDNN's NVFP4 GEMM takes 16-blocks, got {sa} x {sb}"
        return scaled_matmul_problem(device)
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


def _choose(a, b, impl: str) -> tuple[str, str]:
    if impl != "auto":
        problem = _problem(impl, a, b)
        if problem is not None:
            raise ValueError(f"dot_general: impl={impl!r} cannot run these operands: {problem}")
        return impl, "requested"
    platform = _device(a, b).platform
    if platform != "gpu":
        return "emulated", f"the {platform} backend has no low-precision GEMM"
    reasons = []
    for candidate in ("fp8", "scaled_matmul"):
        problem = _problem(candidate, a, b)
        if problem is None:
            return candidate, "; ".join(reasons) or "the fastest that runs"
        reasons.append(f"not {candidate}: {problem}")
    return "dequantize", "; ".join(reasons)


# --- the product -----------------------------------------------------------------------


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _dot(lhs, rhs, plan: _Plan) -> jax.Array:
    return _forward(lhs, rhs, plan)[0]


def _forward(lhs, rhs, plan: _Plan):
    """(product, quantized a, quantized b) of operands already in the one layout."""
    a, b = _operand(lhs, plan.lhs_scheme), _operand(rhs, plan.rhs_scheme)
    impl, reason = _choose(a, b, plan.impl)
    logger.debug(f"dot_general {_describe(a)} x {_describe(b)}: impl={impl!r} ({reason})")
    if impl == "fp8":
        y = _fp8_dot(a, b, plan.precision, plan.out_dtype, plan.out_sharding)
    elif impl == "scaled_matmul":
        y = _block_scaled_dot(a, b)
    elif impl == "dequantize":
        compute = jnp.result_type(_operands.hp_dtype(a), _operands.hp_dtype(b))
        y = _kdot(_values(a, compute), _values(b, compute), plan.precision, plan.out_sharding)
    elif impl == "emulated":
        y = _kdot(
            _values(a, jnp.float32),
            _values(b, jnp.float32),
            lax.Precision.HIGHEST,
            plan.out_sharding,
        )
    else:
        raise ValueError(f"unknown impl {impl!r}")
    return y.astype(plan.out_dtype), a, b


def _dot_jvp(plan: _Plan, primals, tangents):
    """Straight-through: d(a·b) = da·deq(b) + deq(a)·db for high-precision a, b.

    Symbolic zeros: a dot with an operand nobody differentiates is never computed."""
    lhs, rhs = primals
    dlhs, drhs = tangents
    y, a, b = _forward(lhs, rhs, plan)
    dy = jnp.zeros(y.shape, plan.out_dtype)
    if _differentiated(lhs, dlhs):
        dy = dy + _kdot(dlhs, _values(b, dlhs.dtype), plan.precision, plan.out_sharding).astype(
            plan.out_dtype
        )
    if _differentiated(rhs, drhs):
        dy = dy + _kdot(_values(a, drhs.dtype), drhs, plan.precision, plan.out_sharding).astype(
            plan.out_dtype
        )
    return y, dy


_dot.defjvp(_dot_jvp, symbolic_zeros=True)


def _differentiated(primal, tangent) -> bool:
    return not isinstance(primal, _qarray.QArray) and not isinstance(
        tangent, jax.custom_derivatives.SymbolicZero
    )


def _kdot(a, b, precision, out_sharding=None, written=jnp.float32) -> jax.Array:
    """a (..., K) times b (N, K) contracting K, accumulated in float32 and written in
    `written`."""
    return lax.dot_general(
        a,
        b,
        (((a.ndim - 1,), (1,)), ((), ())),
        precision=precision,
        preferred_element_type=written,
        out_sharding=out_sharding,
    )


def _values(x, dtype) -> jax.Array:
    """What an operand stands for, in `dtype`."""
    if isinstance(x, _qarray.QArray):
        return _quantize.dequantize(x, jnp.dtype(dtype).name)
    return x.astype(dtype)


def _fp8_dot(
    a: _qarray.QArray, b: _qarray.QArray, precision, out_dtype, out_sharding=None
) -> jax.Array:
    """fp8 codes into one 2-D dot, then the decode scales (spec §3.1 `d`); the caller
    rounds to the output dtype. Two forms (`_gemm_output_form`):

    - "float32": the dot accumulates in float32 and writes float32, the scales multiply
      it, and the caller rounds once.
    - "bf16_scalar", for two tensorwise operands, a bfloat16 output and M·K·N of at
      least `BF16_OUTPUT_MIN_MACS`, where the GEMM uses fast accumulation or both scales
      are powers of two: the dot writes bfloat16 and is multiplied by the scalar scale in
      bfloat16, flax's form, which XLA folds into cuBLASLt's fp8 GEMM: its epilogue
      scales the float32 accumulator and rounds once.

    The scale is rounded to bfloat16 first, which is exact for a power of two. Otherwise
    its relative error, up to 2**-8, can reach one ulp of the output, 1.5 ulp with the
    rounding: past spec §7's elementwise bound (one ulp plus the accumulation term),
    which holds without fast accumulation. So the tensorwise recipe's dgrad and wgrad
    (HIGHEST, scales not powers of two) keep the float32 form; under fast accumulation
    (its forward GEMM) spec §7 asks for 40 dB only.

    Row or column scales keep the float32 form: XLA folds no vector scales into its fp8
    GEMM. The codes go into the dot as they are, not in XLA's dequantize pattern (a dot
    of `convert(codes) * scale`), which reaches the fp8 GEMM only when the codes are
    inputs of the computation. What each form cost on the H200, and the forms tried and
    dropped: docs/performance.md, "Where the time goes (JAX)".
    """
    lead, k = a.shape[:-1], a.shape[-1]
    codes_a = a.codes.reshape(-1, k)
    row = a.scale.reshape(-1, 1) if isinstance(a.scheme, lowp.AxisScaling) else a.scale
    col = b.scale.reshape(1, -1) if isinstance(b.scheme, lowp.AxisScaling) else b.scale
    macs = codes_a.shape[0] * k * b.shape[0]
    if _gemm_output_form(a.scheme, b.scheme, out_dtype, macs, precision) == "bf16_scalar":
        y = _kdot(codes_a, b.codes, precision, out_sharding, jnp.bfloat16)
        y = y * (row * col).astype(jnp.bfloat16)
    else:
        y = _kdot(codes_a, b.codes, precision, out_sharding) * (row * col)
    return y.reshape(lead + (b.shape[0],))


# M·K·N from which the tensorwise bfloat16 form runs (`gemm_output`'s default): below it
# XLA's autotuner may give the form to a Triton GEMM fusion instead of cuBLASLt's fp8 GEMM
# (docs/performance.md, "Where the time goes (JAX)"). The training layers' small-shape
# policy (`lowp._small_shapes`) sends calls below about 2**38 to high precision on such a
# GPU, so an fp8 training GEMM between the two gets the float32 form.
BF16_OUTPUT_MIN_MACS = 2**39

GEMM_OUTPUTS = ("auto", "float32")
_GEMM_OUTPUT = _switches.Switch(("auto", BF16_OUTPUT_MIN_MACS))  # (form, bf16_min_macs)


def gemm_output(form: str = "auto", *, bf16_min_macs: int = BF16_OUTPUT_MIN_MACS):
    """Inside the block, lowp_jax's fp8 GEMMs (`dot_general`'s "fp8" branch and the
    training recipes' GEMMs) write `form`'s output.

    Args:
      form: "auto" (the default: the GEMM writes bfloat16 with the scalar scale folded
        into it for two tensorwise operands, a bfloat16 output, M·K·N of at least
        `bf16_min_macs`, and fast accumulation or power-of-two scales on both; float32
        otherwise, scaled and rounded once after) or "float32" (float32 for every
        operand pair). See `_fp8_dot` for why the bfloat16 form is limited so.
      bf16_min_macs: M·K·N from which "auto" takes the bfloat16 form; 0 takes it at
        every size, where XLA may give small dots to a Triton GEMM fusion instead of
        cuBLASLt's fp8 GEMM.

    For measuring one form against the other (the benchmarks run a training step and
    single GEMMs under each), and for tests to reach the bfloat16 form at the sizes a
    CPU can check. Scoped like `lowp_jax.cast_kernels`: a context manager undone on
    exit, process-wide and thread-safe. The setting is read when a computation is
    traced and is part of what jit's caches key on (`lowp_jax._switches`): a jitted
    function called under another setting is traced again, one compiled inside the
    block keeps the block's setting.

    >>> import jax, jax.numpy as jnp, lowp_jax
    >>> x = jnp.full((2, 8), 3.0, jnp.bfloat16)
    >>> def dot(x):
    ...     dims = (((1,), (1,)), ((), ()))
    ...     return lowp_jax.dot_general(x, x, dims, config="float8_tensorwise", impl="fp8")
    >>> with lowp_jax.gemm_output("auto", bf16_min_macs=0):  # bfloat16 at any size
    ...     jaxpr = str(jax.make_jaxpr(dot)(x))
    >>> "preferred_element_type=bfloat16" in jaxpr
    True
    >>> with lowp_jax.gemm_output("float32"):
    ...     y = dot(x)
    >>> y.tolist()
    [[72.0, 72.0], [72.0, 72.0]]
    """
    if form not in GEMM_OUTPUTS:
        raise ValueError(f"gemm_output form must be one of {GEMM_OUTPUTS}, got {form!r}")
    if isinstance(bf16_min_macs, bool) or not isinstance(bf16_min_macs, int) or bf16_min_macs < 0:
        raise ValueError(f"bf16_min_macs must be an int >= 0, got {bf16_min_macs!r}")
    return _GEMM_OUTPUT.setting((form, bf16_min_macs))


def _gemm_output_form(sa, sb, out_dtype, macs: int, precision) -> str:
    """`_fp8_dot`'s form: "bf16_scalar" for two tensorwise operands, a bfloat16 output,
    `macs` (M·K·N) of at least `gemm_output`'s bf16_min_macs (BF16_OUTPUT_MIN_MACS by
    default) and either fast accumulation (`_fast_accumulation`) or power-of-two scales
    on both, unless `gemm_output` is "float32"; else "float32"."""
    form, bf16_min_macs = _GEMM_OUTPUT.value
    tensorwise = isinstance(sa, lowp.TensorScaling) and isinstance(sb, lowp.TensorScaling)
    if (
        form == "auto"
        and tensorwise
        and np.dtype(out_dtype) == jnp.bfloat16
        and macs >= bf16_min_macs
        and (_fast_accumulation(precision) or (sa.pow2 and sb.pow2))
    ):
        return "bf16_scalar"
    return "float32"


def _fast_accumulation(precision) -> bool:
    """Whether XLA's cuBLASLt fp8 GEMM accumulates fast at `precision`: exactly when both
    operands' precision is DEFAULT (None, the enum, or a string naming it, as
    lax.dot_general takes them). A `lax.DotAlgorithmPreset` counts as not."""
    pair = precision if isinstance(precision, (tuple, list)) else (precision, precision)

    def default(p):
        if p is None:
            return True
        if isinstance(p, str):
            p = lax.Precision(p)
        return p == lax.Precision.DEFAULT

    return all(default(p) for p in pair)


def _block_scaled_dot(a: _qarray.QArray, b: _qarray.QArray) -> jax.Array:
    """MX / NVFP4 operands through jax.nn.scaled_matmul (cuDNN on Blackwell)."""
    data_a, scales_a = scaled_matmul_operands(a)
    data_b, scales_b = scaled_matmul_operands(b)
    y = jax.nn.scaled_matmul(data_a, data_b, scales_a, scales_b, preferred_element_type=jnp.float32)
    if a.global_scale is not None:
        y = y * a.global_scale
    if b.global_scale is not None:
        y = y * b.global_scale
    return y.reshape(a.shape[:-1] + (b.shape[0],))


def scaled_matmul_operands(q: _qarray.QArray) -> tuple[jax.Array, jax.Array]:
    """An MX or NVFP4 QArray (..., K) as `jax.nn.scaled_matmul`'s (1, rows, K) element
    array (float8 codes as they are; fp4 codes unpacked to float4_e2m1fn) and
    (1, rows, K / block) block scales (float8_e8m0fnu for MX, float8_e4m3fn for NVFP4).
    NVFP4's global scale is not included: it multiplies the product."""
    q = q.with_scale_layout("plain")
    k = q.shape[-1]
    rows = math.prod(q.shape[:-1])
    if q.fmt == "float4_e2m1fn":
        codes = _layouts.unpack_fp4(q.codes)
        # Every e2m1 value is exact in float32, so this cast is exact (spec §0.5).
        data = _encode.decode(codes, extend.FLOAT4_E2M1FN).astype(jnp.float4_e2m1fn)
    else:
        data = q.codes
    scale = q.scale
    if isinstance(q.scheme, lowp.MXScaling):
        scale = lax.bitcast_convert_type(scale, jnp.float8_e8m0fnu)
    return data.reshape(1, rows, k), scale.reshape(1, rows, k // q.scheme.block)


def _describe(x) -> str:
    if isinstance(x, _qarray.QArray):
        return f"{type(x.scheme).__name__}({x.fmt}){list(x.shape)}"
    return f"{x.dtype}{list(x.shape)}"
