"""Training recipes (spec §8) as a `jax.custom_vjp` dot_general: `y = x @ w.T` whose
forward, dgrad and wgrad GEMMs each run on operands quantized as a `lowp.Recipe` says,
executing the recipe's `lowp.extend.LinearPlan`.

With x: (M, K) (the input's leading dims flattened into M), w: (N, K), g = dL/dy: (M, N),
every GEMM is `a @ b.T` with both operands quantized along their last axis, the GEMM's
reduction axis (the plan's orientation):

  forward  y  = x @ w.T     a = x   (M, K)   b = w   (N, K)   along K
  dgrad    dx = g @ w       a = g   (M, N)   b = w.T (K, N)   along N
  wgrad    dw = g.T @ x     a = g.T (N, M)   b = x.T (K, M)   along M

Current scaling, stateless: every scale comes from the tensor it scales, in the same
call. There is no amax history or other state to carry, checkpoint, shard or overwrite
with a gradient (the trick delayed scaling needs), so the dot is a pure function and
composes with `jit`, `grad`, `lax.scan`, gradient accumulation and sharding as any is.

Residuals: the forward keeps the high-precision x and w, and the backward re-quantizes
each along its own reduction axis (spec §8: never from another orientation's codes),
writing the transposed operand's codes directly where a kernel can
(`quantize_transposed`). Where the plan reuses codes (`LinearPlan.keeps_codes`: the
backward reads the tensor with its forward scheme, tensorwise or square 128x128
blocks) the forward keeps its codes instead, one byte an element, and the backward
transposes them and their scales: such groups do not care about orientation. The incoming gradient's codes are shared
between dgrad and wgrad the same way.

Fast accumulation: XLA picks a GEMM's accumulation from the dot's precision config.
Its cuBLASLt fp8 GEMM sets CUBLASLT_MATMUL_DESC_FAST_ACCUM exactly when the dot's
precision is DEFAULT (xla/stream_executor/cuda/cuda_blas_lt.cc, `IsFastAccumEnabled`),
so a GEMM with `fast_accum` runs at `lax.Precision.DEFAULT` and the others at
`lax.Precision.HIGHEST`. Off the GPU (impl "emulated") every quantized GEMM is an exact
float32 product of the dequantized operands. High-precision GEMMs (the `_gw_hp`
recipes' wgrad) run at the caller's `precision`, as the unquantized layer would.
"""

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import lowp
from lowp import extend
from lowp_jax import _bits, _devices, _dot, _qarray, _quantize, _quantized_dot
from lowp_jax import _dot_operands as _operands

_A_BT = (((1,), (1,)), ((), ()))  # a @ b.T for rank-2 a, b: contract the last axes


logger = logging.getLogger("lowp_jax")
SMALL_SHAPES = ("auto", "quantize")


@dataclasses.dataclass(frozen=True)
class _Call:
    """What is static about one call: hashable, the nondiff argument of the custom VJP."""

    plan: extend.LinearPlan  # the recipe's
    impl: str
    precision: object  # the caller's, for high-precision GEMMs
    out_dtype: np.dtype
    input_shape: tuple[int, ...]  # lhs as passed, for errors about M


def training_dot_general(
    lhs,
    rhs,
    dimension_numbers,
    precision=None,
    preferred_element_type=None,
    *,
    recipe,
    impl: str = "auto",
    small_shapes: str = "auto",
) -> jax.Array:
    """`lax.dot_general` of an activation and a weight whose forward and backward GEMMs
    run quantized with a training recipe (spec §8).

    Args:
      lhs: the activation x, float32 / bfloat16 / float16, any rank >= 1; its leading
        dims are flattened into M (the tokens) for the backward GEMMs.
      rhs: the weight, rank 2: (N, K) contracting axis 1, or flax's kernel (K, N)
        contracting axis 0 (its gradient comes back in the same layout).
      dimension_numbers: `((lhs_contracting, rhs_contracting), ((), ()))`: one
        contracting axis each, no batch axes (flax's Dense/Linear pass
        `(((x.ndim - 1,), (0,)), ((), ()))`).
      precision: used by high-precision GEMMs only; quantized GEMMs take theirs from
        `GemmSpec.fast_accum` (see the module docstring).
      preferred_element_type: the output dtype; default the dtype of lhs (spec §8:
        output dtype = the input's, so a bfloat16 input and a float32 master kernel give
        a bfloat16 output). dx comes back in lhs's dtype and dw in rhs's, each rounded
        once from the GEMM's float32 accumulator.
      recipe: a `lowp.Recipe` or its name (`lowp.Recipe.names()`).
      impl: the `lowp_jax.dot_general` branch of every quantized GEMM: "auto" (the fp8
        GEMM on a GPU that has one, emulation on CPU) or one of the names it lists.
      small_shapes: "auto" runs a call in high precision (lhs's dtype, float32
        accumulation, each GEMM rounded once; dw in the kernel's dtype) where the device
        has fp8 (MX: block-scaled) GEMM kernels but the call is too small for them to pay
        for the casts (`lowp._small_shapes`: the predicted times of both; of the device
        alone under jit, where a call has no host time of its own), and says so at INFO
        while tracing. Off such devices (CPU; MX before compute capability 10.0)
        the recipe always runs. "quantize" always runs the recipe.

    Returns:
      y: lhs's free dims followed by N, as `lax.dot_general`.

    Raises:
      ValueError: naming the dim or operand: those of `lowp_jax.dot_general`, or a dim
        a recipe's scheme cannot quantize (mxfp8: K, N and, under differentiation, M
        must be multiples of 32, M being the product of lhs's free dims), or a recipe
        asking for float32 weight gradients of a kernel that is not float32.
      TypeError: a QArray operand (training needs the high-precision tensors; after
        `lowp_jax.to_inference` use `lowp_jax.QuantizedDotGeneral`), a dtype other than
        float32 / bfloat16 / float16, or a recipe that is not one.

    >>> import jax, jax.numpy as jnp, lowp_jax
    >>> x, kernel = jnp.ones((2, 32, 128)), jnp.full((128, 64), 0.5)  # flax layout (K, N)
    >>> dims = (((2,), (0,)), ((), ()))
    >>> loss = lambda k: lowp_jax.training_dot_general(x, k, dims, recipe="mxfp8").sum()
    >>> jax.grad(loss)(kernel)[0, :3].tolist()
    [64.0, 64.0, 64.0]
    """
    recipe = lowp.Recipe.of(recipe)
    if impl not in _dot.IMPLS:
        raise ValueError(f"impl must be one of {_dot.IMPLS}, got {impl!r}")
    if small_shapes not in SMALL_SHAPES:
        raise ValueError(f"small_shapes must be one of {SMALL_SHAPES}, got {small_shapes!r}")
    for name, operand in (("lhs", lhs), ("rhs", rhs)):
        if isinstance(operand, _qarray.QArray):
            raise TypeError(
                f"training_dot_general: {name} is a QArray ({operand.scheme}); training "
                "quantizes the high-precision tensors at each call. For a kernel quantized "
                "by lowp_jax.to_inference, use lowp_jax.QuantizedDotGeneral"
            )
    lc, rc = _operands.contracting_dims(
        dimension_numbers, _operands.shape_of(lhs), _operands.shape_of(rhs)
    )
    x = jnp.moveaxis(_operands.hp(lhs, "lhs"), lc, -1)
    w = _operands.hp(rhs, "rhs")
    w = w if rc == 1 else w.T
    lead, (n, k) = x.shape[:-1], w.shape
    x = x.reshape(-1, k)
    if recipe.fp32_weight_grad_accumulation and w.dtype != jnp.float32:
        raise ValueError(
            f"recipe {recipe.name!r} asks for float32 weight gradients, but the kernel is "
            f"{w.dtype} and JAX returns a gradient in its primal's dtype: pass the float32 "
            "kernel (flax's Linear casts it to the layer's dtype first: give nnx.Linear a "
            "promote_dtype that leaves it float32) and sum micro-batch gradients in float32"
        )
    input_shape = tuple(lhs.shape)
    plan = extend.LinearPlan.of(recipe)
    _check_shapes(plan, x.shape[0], k, n, backward=False, input_shape=input_shape)
    out_dtype = np.dtype(x.dtype if preferred_element_type is None else preferred_element_type)
    call = _Call(plan, impl, precision, out_dtype, input_shape)
    if small_shapes == "auto" and in_high_precision(recipe, impl, x, w):
        y = _high_precision_linear(x, w, call)
    else:
        y = _linear(x, w, call)
    return y.reshape(lead + (n,))


def in_high_precision(recipe, impl: str, x, w) -> bool:
    """The small-shape policy (`lowp._small_shapes`) for x (M, K) and w (N, K): whether the
    call runs in high precision, because the fp8 GEMM kernels would run it at a loss."""
    if not fp8_kernels_run(recipe, impl, _dot._device(x, w)):
        return False
    (m, k), n = x.shape, w.shape[0]
    traced = _traced(x)
    if extend.call_pays(m, k, n, recipe.name, traced):
        return False
    logger.info(
        f"training_dot_general: {recipe.name} runs in high precision "
        f"({extend.describe_small_shape(m, k, n, recipe.name, traced)}); "
        "small_shapes='quantize' forces fp8"
    )
    return True


def _traced(x) -> bool:
    """Whether x is traced into a compiled program (under jit, a call has no host time of
    its own): a tracer with no concrete value. Under grad alone the call still runs op by
    op, with concrete values; under vmap alone it counts as traced."""
    return isinstance(x, jax.core.Tracer) and x.to_concrete_value() is None


def fp8_kernels_run(recipe, impl: str, device) -> bool:
    """Whether the recipe's quantized GEMMs get real low-precision kernels on `device`:
    float8 on CUDA compute capability 8.9+, MX and NVFP4 on 10.0+ (else they are
    emulated or dequantized, and the layer is there for its numerics)."""
    if impl in ("emulated", "dequantize"):
        return False
    capability = _devices.cuda_capability(device)
    return capability is not None and capability >= ((10, 0) if recipe.block_scaled else (8, 9))


def _check_shapes(plan, m, k, n, *, backward: bool, input_shape) -> None:
    """ValueError naming the GEMM, operand and dim (`LinearPlan.check`) and the input's
    shape, if a quantized GEMM's scheme cannot take its operand."""
    try:
        plan.check(m, k, n, backward=backward)
    except ValueError as e:
        raise ValueError(
            f"{e}; the input has shape {input_shape}, its leading dims flattened into M"
        ) from None


# --- the quantized operands of each GEMM ------------------------------------------------


def _forward_operands(x, w, plan) -> tuple[_qarray.QArray, _qarray.QArray]:
    """x (M, K) and w (N, K), quantized along K as the forward's operands say (their
    rounding and transform included)."""
    return _quantize_operand(x, plan.forward.a), _quantize_operand(w, plan.forward.b)


def _residuals(x, w, forward, plan) -> tuple:
    """What the backward keeps of x and w: the forward codes where the plan reuses them
    (`LinearPlan.keeps_codes`), else the high-precision tensor."""
    qx, qw = forward
    return (qx if plan.keeps_codes("x") else x, qw if plan.keeps_codes("w") else w)


def _backward_operands(g, x_kept, w_kept, plan) -> tuple:
    """(dgrad, wgrad) operand pairs, each None where that GEMM runs in high precision."""
    dgrad = wgrad = None
    if plan.dgrad is not None:
        g_q = _quantize_operand(g, plan.dgrad.a)
        dgrad = (g_q, _transposed(w_kept, plan.dgrad.b))
    if plan.wgrad is not None:
        g_kept = g_q if plan.keeps_codes("g") else g
        wgrad = (_transposed(g_kept, plan.wgrad.a), _transposed(x_kept, plan.wgrad.b))
    return dgrad, wgrad


def _transposed(kept, operand) -> _qarray.QArray:
    """The rank-2 operand kept.T quantized as `operand` (a transposed operand of the plan)
    says: reused codes transposed, or the high-precision tensor's transpose quantized
    (`quantize_transposed`: on an sm_90 GPU a rowwise scheme's kernel writes the codes
    transposed, with no transposed copy of the high-precision tensor)."""
    if isinstance(kept, _qarray.QArray):  # tensorwise (scale ()) or square block tiles
        return _qarray.QArray(
            codes=kept.codes.T,
            scale=kept.scale.T,
            global_scale=None,
            scheme=operand.scheme,
            shape=kept.shape[::-1],
            hp_dtype=kept.hp_dtype,
        )
    if not operand.plain:
        return _quantize_operand(kept.T, operand)
    return _quantize.quantize_transposed(kept, operand.scheme, name=operand.name)


def _quantize_operand(t, operand) -> _qarray.QArray:
    """t (the operand as the GEMM reads it) quantized as `operand` says: `quantize` with
    its scheme, after the random Hadamard transform where the plan asks for it, with
    stochastic rounding from the recipe's seed and t's data where it asks for that
    (spec §8, `OperandPlan.quantize_reference`)."""
    if operand.hadamard:
        signs = jnp.asarray(operand.signs(t.shape[-1]))
        t = extend.hadamard_transform(
            _bits.ftz(t.astype(jnp.float32)), signs, stack=jnp.stack, ftz=_bits.ftz
        )
    if operand.rounding == "nearest":
        return _quantize.quantize(t, operand.scheme, name=operand.name)
    # extend.data_offset: uint32 sums wrap mod 2**32, in any order
    offset = jnp.sum(_bits.bits(_bits.ftz(t.astype(jnp.float32))), dtype=jnp.uint32)
    return _quantize.quantize(
        t,
        operand.scheme,
        rounding="stochastic",
        seed=operand.rounding_seed,
        offset=offset,
        name=operand.name,
    )


# --- the GEMMs ---------------------------------------------------------------------------


def _gemm(operands, gemm: extend.GemmPlan, call: _Call, out_dtype, like=None) -> jax.Array:
    """a @ b.T of quantized operands, with fast accumulation where the plan allows it;
    `like`: the primal a backward GEMM's output is the cotangent of (`_sharding_like`)."""
    precision = lax.Precision.DEFAULT if gemm.fast_accum else lax.Precision.HIGHEST
    return _dot.dot_general(
        *operands, _A_BT, precision, out_dtype, impl=call.impl, out_sharding=_sharding_like(like)
    )


def _sharding_like(x):
    """Under a mesh with Explicit axes (`jax.make_mesh`'s default), the sharding of `x`
    (or of a QArray's codes): a cotangent has its primal's sharding, and a backward GEMM
    contracting a sharded dim (wgrad over a data-parallel M) must be told it. Else None:
    XLA's propagation decides, as for any dot."""
    if x is None:
        return None
    mesh = jax.sharding.get_abstract_mesh()
    if not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return None
    return jax.typeof(x.codes if isinstance(x, _qarray.QArray) else x).sharding


def _hp_gemm(a, b, call: _Call, out_dtype, like=None) -> jax.Array:
    """a @ b.T in high precision, accumulated in float32 and rounded once."""
    compute = jnp.result_type(a, b)
    y = lax.dot_general(
        a.astype(compute),
        b.astype(compute),
        _A_BT,
        precision=call.precision,
        preferred_element_type=jnp.float32,
        out_sharding=_sharding_like(like),
    )
    return y.astype(out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _linear(x, w, call: _Call) -> jax.Array:
    plan = call.plan
    return _gemm(_forward_operands(x, w, plan), plan.forward, call, call.out_dtype)


def _linear_fwd(x, w, call: _Call):
    # Differentiated: the backward GEMMs' dims must suit their schemes too (M for wgrad).
    plan = call.plan
    m, k, n = x.shape + w.shape[:1]
    _check_shapes(plan, m, k, n, backward=True, input_shape=call.input_shape)
    forward = _forward_operands(x, w, plan)
    y = _gemm(forward, plan.forward, call, call.out_dtype)
    return y, _residuals(x, w, forward, plan)


def _linear_bwd(call: _Call, kept, g):
    plan = call.plan
    x_kept, w_kept = kept
    x_dtype, w_dtype = _operands.hp_dtype(x_kept), _operands.hp_dtype(w_kept)
    dgrad, wgrad = _backward_operands(g, x_kept, w_kept, plan)
    if dgrad is None:
        dx = _hp_gemm(g, w_kept.T, call, x_dtype, like=x_kept)
    else:
        dx = _gemm(dgrad, plan.dgrad, call, x_dtype, like=x_kept)
    if wgrad is None:
        dw = _hp_gemm(g.T, x_kept.T, call, w_dtype, like=w_kept)
    else:
        dw = _gemm(wgrad, plan.wgrad, call, w_dtype, like=w_kept)
    return dx, dw


_linear.defvjp(_linear_fwd, _linear_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _high_precision_linear(x, w, call: _Call) -> jax.Array:
    """The small-shape policy's fallback: the three GEMMs in x's dtype, accumulated in
    float32 and rounded once (`_hp_gemm`), dw in the kernel's dtype. A custom VJP, since
    differentiating `w.astype(x.dtype)` would round a float32 kernel's gradient to x's
    dtype; this keeps the precision the recipe's wgrad has (and lowp_torch's fallback)."""
    return _hp_gemm(x, w.astype(x.dtype), call, call.out_dtype)


def _high_precision_fwd(x, w, call: _Call):
    return _high_precision_linear(x, w, call), (x, w)


def _high_precision_bwd(call: _Call, kept, g):
    x, w = kept
    g = g.astype(x.dtype)
    return (
        _hp_gemm(g, w.astype(x.dtype).T, call, x.dtype, like=x),
        _hp_gemm(g.T, x.T, call, w.dtype, like=w),
    )


_high_precision_linear.defvjp(_high_precision_fwd, _high_precision_bwd)


def training_operands(x, w, g, recipe) -> dict:
    """The quantized operands of the three GEMMs of `y = x @ w.T`, exactly as
    `training_dot_general` computes them (the same functions build both).

    Pure and jit-able with `recipe` static. For a cross-framework check: given the same
    recipe and arrays, every backend must return these bytes.

    Args:
      x: the input (..., K), its leading dims flattened into M; w: the weight (N, K),
        (out_features, in_features) in every framework; g = dL/dy: (..., N) with x's
        leading dims. float32, bfloat16 or float16.
      recipe: a `lowp.Recipe` or its name.

    Returns:
      {"forward": (a, b), "dgrad": (a, b), "wgrad": (a, b)}, each GEMM being `a @ b.T`
      with a, b QArrays quantized along their last axis (`lowp.extend.LinearPlan`):
      forward (x (M, K), w (N, K)), dgrad (g (M, N), w.T (K, N)), wgrad (g.T (N, M),
      x.T (K, M)); None in place of a pair for a GEMM the recipe runs in high precision.
      Tensorwise operands the backward reuses are the forward's codes transposed, which
      are bit-identical to quantizing the transpose.

    >>> import jax.numpy as jnp, lowp_jax
    >>> ops = lowp_jax.training_operands(
    ...     jnp.ones((64, 128)), jnp.ones((64, 128)), jnp.ones((64, 64)), "float8_rowwise_gw_hp")
    >>> [q.shape for q in ops["dgrad"]], ops["wgrad"]
    ([(64, 64), (128, 64)], None)
    """
    recipe = lowp.Recipe.of(recipe)
    x, w, g = (_operands.hp(t, name) for t, name in ((x, "x"), (w, "w"), (g, "g")))
    if (
        w.ndim != 2
        or x.ndim < 1
        or x.shape[-1] != w.shape[1]
        or g.shape != x.shape[:-1] + w.shape[:1]
    ):
        raise ValueError(
            f"training_operands takes x (..., K), w (N, K) and g (..., N) with x's leading "
            f"dims; got x {x.shape}, w {w.shape}, g {g.shape}"
        )
    (n, k), input_shape = w.shape, x.shape
    x, g = x.reshape(-1, k), g.reshape(-1, n)
    m = x.shape[0]
    plan = extend.LinearPlan.of(recipe)
    _check_shapes(plan, m, k, n, backward=True, input_shape=input_shape)
    forward = _forward_operands(x, w, plan)
    dgrad, wgrad = _backward_operands(g, *_residuals(x, w, forward, plan), plan)
    return {"forward": forward, "dgrad": dgrad, "wgrad": wgrad}


@dataclasses.dataclass(frozen=True)
class TrainingDotGeneral:
    """A `dot_general` for flax layers that trains with a `lowp.Recipe`:
    `flax.nnx.Linear(..., dot_general=TrainingDotGeneral("float8_rowwise"))`.

    The kernel is the high-precision flax kernel (in, out); the forward and both
    backward GEMMs are quantized at each call (`lowp_jax.training_dot_general`). flax's
    Linear/Dense cast the kernel to the layer's `dtype` before calling it, so a bfloat16
    layer would quantize a bfloat16 copy of its float32 parameters (rounded twice, and
    not the bytes `lowp_torch.Linear` makes under autocast). Pass
    `promote_dtype=lowp_jax.nnx.master_weight_promote_dtype` to `nnx.Linear` to quantize
    the float32 kernel itself, or use `lowp_jax.nnx.Linear(recipe=...)`, which does.

    Hashable and a static pytree node (no leaves), like `QuantizedDotGeneral`.

    Attributes:
      recipe: the `lowp.Recipe`, or its name ("float8_tensorwise", "mxfp8", ...).
      impl: the `lowp_jax.dot_general` branch of the quantized GEMMs ("auto").
      small_shapes: "auto" or "quantize", as `training_dot_general` takes it.

    >>> import jax, jax.numpy as jnp, lowp_jax
    >>> from flax import nnx
    >>> layer = nnx.Linear(128, 64, dot_general=lowp_jax.TrainingDotGeneral("mxfp8"),
    ...                    rngs=nnx.Rngs(0))
    >>> grads = nnx.grad(lambda m: m(jnp.ones((64, 128))).sum())(layer)
    >>> grads["kernel"].shape
    (128, 64)
    """

    recipe: lowp.Recipe
    impl: str = "auto"
    small_shapes: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "recipe", lowp.Recipe.of(self.recipe))
        if self.impl not in _dot.IMPLS:
            raise ValueError(f"impl must be one of {_dot.IMPLS}, got {self.impl!r}")
        if self.small_shapes not in SMALL_SHAPES:
            raise ValueError(
                f"small_shapes must be one of {SMALL_SHAPES}, got {self.small_shapes!r}"
            )

    def __call__(
        self,
        lhs,
        rhs,
        dimension_numbers,
        precision=None,
        preferred_element_type=None,
        out_sharding=None,
    ) -> jax.Array:
        if out_sharding is not None:
            raise NotImplementedError(
                "TrainingDotGeneral does not take out_sharding (explicit sharding mode); "
                "shard its inputs under jit instead"
            )
        return training_dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision,
            preferred_element_type,
            recipe=self.recipe,
            impl=self.impl,
            small_shapes=self.small_shapes,
        )


jax.tree_util.register_static(TrainingDotGeneral)


def training_dot_general_cls(recipe, impl: str = "auto", small_shapes: str = "auto"):
    """What `flax.linen.Dense(dot_general_cls=...)` takes: a zero-argument callable
    returning `TrainingDotGeneral(recipe, impl, small_shapes)`.

    >>> import jax, jax.numpy as jnp, flax.linen as nn, lowp_jax
    >>> dense = nn.Dense(64, dot_general_cls=lowp_jax.training_dot_general_cls("float8_rowwise"))
    >>> params = dense.init(jax.random.key(0), jnp.ones((64, 128)))
    >>> jax.grad(lambda p: dense.apply(p, jnp.ones((64, 128))).sum())(params)["params"]["kernel"].shape
    (128, 64)
    """
    return functools.partial(TrainingDotGeneral, lowp.Recipe.of(recipe), impl, small_shapes)


def layer_dot_general(config, recipe, impl: str, small_shapes: str = "auto"):
    """The dot of a lowp_jax layer: `QuantizedDotGeneral(config)` for inference or
    `TrainingDotGeneral(recipe, impl, small_shapes)` for training; TypeError unless
    exactly one is given. `small_shapes` is the training policy's: an inference config
    takes only "auto" (it quantizes what its filter chose)."""
    if (config is None) == (recipe is None):
        raise TypeError(
            "pass exactly one of config= (inference: a lowp.InferenceConfig or preset name) "
            f"and recipe= (training: a lowp.Recipe or recipe name); got config={config!r}, "
            f"recipe={recipe!r}"
        )
    if small_shapes not in SMALL_SHAPES:
        raise ValueError(f"small_shapes must be one of {SMALL_SHAPES}, got {small_shapes!r}")
    if recipe is not None:
        return TrainingDotGeneral(recipe, impl, small_shapes)
    if small_shapes != "auto":
        raise ValueError(
            f"small_shapes={small_shapes!r} is a training option (with recipe=); an inference "
            f"config quantizes every layer it is given, got config={config!r}"
        )
    return _quantized_dot.QuantizedDotGeneral(config, impl)
