"""flax nnx layers on lowp_jax's quantized dot.

`Linear` is `flax.nnx.Linear` with a QArray-aware `promote_dtype` and, for inference, a
`QuantizedDotGeneral` (its kernel high precision, quantized at each call, or a QArray
(out, in) from `lowp_jax.quantize_params`) or, for training, a `TrainingDotGeneral`.
`quantize_model` converts an existing model's `nnx.Linear` layers for inference.
`GroupedExperts` is an MoE layer's stacked SwiGLU experts on `lowp_jax.ragged_dot`.
`small_shapes_report` prints what each training layer of a model runs at a token count.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from lowp import extend
from lowp_jax import _params, _qarray, _quantized_dot, _ragged_dot, _training


def promote_dtype(args, /, *, dtype=None, inexact=True):
    """`flax.nnx.nn.dtypes.promote_dtype` that leaves QArrays quantized (their `hp_dtype`
    follows the promotion): pass it as `nnx.Linear(promote_dtype=...)` with a QArray kernel."""
    return _quantized_dot.promote(args, dtype, inexact)


class Linear(nnx.Linear):
    """`nnx.Linear` whose matmul quantizes with a `lowp.InferenceConfig` (inference) or
    a `lowp.Recipe` (training).

    Args:
      in_features, out_features: as nnx.Linear.
      config: the InferenceConfig or preset name, for inference.
      recipe: instead of config, the training Recipe or recipe name: forward and backward
        GEMMs quantized at each call (`lowp_jax.TrainingDotGeneral`).
      impl: the `lowp_jax.dot_general` branch ("auto").
      small_shapes: with recipe, "auto" (the small-shape policy of
        `lowp_jax.training_dot_general`) or "quantize" (always the recipe).
      **kwargs: the rest of nnx.Linear's arguments (use_bias, dtype, param_dtype,
        precision, kernel_init, bias_init, rngs, ...).

    The kernel is (in, out) as in nnx.Linear while it is high precision (training, or
    quantize-per-call inference); `lowp_jax.quantize_params` of the module's state makes
    it a QArray (out, in), which `nnx.update` puts in place (a layer with a config), and
    `lowp_jax.to_inference` turns a trained model into one.

    >>> import jax.numpy as jnp, lowp_jax, lowp_jax.nnx
    >>> from flax import nnx
    >>> layer = lowp_jax.nnx.Linear(64, 8, config="mxfp8", rngs=nnx.Rngs(0))
    >>> nnx.update(layer, lowp_jax.quantize_params(nnx.state(layer), "mxfp8"))
    >>> type(layer.kernel[...]).__name__, layer(jnp.ones((2, 3, 64))).shape
    ('QArray', (2, 3, 8))
    >>> trained = lowp_jax.nnx.Linear(128, 64, recipe="float8_rowwise", rngs=nnx.Rngs(0))
    >>> nnx.grad(lambda m: m(jnp.ones((64, 128))).sum())(trained)["kernel"].shape
    (128, 64)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        config=None,
        recipe=None,
        impl="auto",
        small_shapes="auto",
        **kwargs,
    ):
        kwargs.setdefault("promote_dtype", master_weight_promote_dtype)
        super().__init__(
            in_features,
            out_features,
            dot_general=_training.layer_dot_general(config, recipe, impl, small_shapes),
            **kwargs,
        )


def small_shapes_report(model: nnx.Module, tokens: int, *, jitted: bool = True) -> str:
    """A table of what each training layer of `model` runs at `tokens` tokens a call (the
    input's leading dims flattened), under `jax.jit` (`jitted`, device time alone) or op
    by op: fp8 or high precision, and the small-shape policy's predicted times of both
    (`lowp._small_shapes`, the policy lowp_torch's layers take:
    `lowp_torch.small_shapes_report` prints the same rows). A training layer is an
    `nnx.Linear` whose dot is a `lowp_jax.TrainingDotGeneral` (`Linear(recipe=...)`);
    rows come in nnx's graph order (attribute names sorted). It is what a device with
    the recipe's fp8 GEMM kernels does (float8 on CUDA sm_89+, MX and NVFP4 on
    sm_100+); elsewhere the recipe always runs. A layer that runs in high precision
    also logs why when it is traced (logger "lowp_jax", INFO).

    Raises:
      ValueError: tokens is not a positive int, or `model` has no such layer.

    >>> import lowp_jax.nnx
    >>> from flax import nnx
    >>> layer = lowp_jax.nnx.Linear(4096, 4096, recipe="float8_rowwise", rngs=nnx.Rngs(0))
    >>> print(lowp_jax.nnx.small_shapes_report(layer, 8192))
    small_shapes at 8192 tokens a call, jitted (device time), where fp8 GEMM kernels run:
    layer        K -> N        recipe          fp8 ms  high-precision ms  runs
    (the model)  4096 -> 4096  float8_rowwise   0.787              1.178  fp8
    """
    rows = []
    for path, node in nnx.iter_graph(model):
        dot = getattr(node, "dot_general", None)
        if isinstance(node, nnx.Linear) and isinstance(dot, _training.TrainingDotGeneral):
            name = ".".join(map(str, path)) or "(the model)"
            forced = dot.small_shapes == "quantize"
            rows.append((name, node.in_features, node.out_features, dot.recipe.name, forced))
    if not rows:
        raise ValueError(
            f"{type(model).__name__} has no training layer: lowp_jax.nnx.Linear(recipe=...) "
            "makes them"
        )
    return extend.small_shapes_table(rows, tokens, traced=jitted, traced_as="jitted")


def master_weight_promote_dtype(args, /, *, dtype=None, inexact=True):
    """`Linear`'s `promote_dtype`: the input and bias are cast as flax casts them; a
    high-precision kernel stays in its parameter dtype, a QArray kernel's `hp_dtype`
    follows the promotion (`promote_dtype`).

    The recipe, or the inference config at each call, quantizes the master weight
    itself (one rounding, not a cast to `dtype` and then another): the bytes
    `lowp_jax.quantize_params` and lowp_torch give the same weight, so a layer's output
    does not change when its kernel is quantized ahead. The product takes the input's
    dtype (`QuantizedDotGeneral`, `training_dot_general`); a weight gradient comes back
    in the parameter dtype."""
    inputs, kernel, bias = promote_dtype(args, dtype=dtype, inexact=inexact)
    return inputs, kernel if isinstance(args[1], _qarray.QArray) else args[1], bias


def quantize_model(model: nnx.Module, config, filter_fn=None, *, impl: str = "auto"):
    """A copy of `model` whose `nnx.Linear` layers run the quantized dot on QArray kernels.

    The kernels of its `nnx.Linear` layers are quantized by `lowp_jax.quantize_params`
    (with `filter_fn`); each `nnx.Linear` whose kernel it quantized gets
    `dot_general=QuantizedDotGeneral(config, impl)` and the QArray-aware `promote_dtype`.
    Other layers with a rank-2 kernel (`nnx.LinearGeneral`, `nnx.Einsum`) keep theirs.
    The model passed in is not changed (the copy shares its other arrays).

    Args:
      model: any nnx module.
      config: a `lowp.InferenceConfig` or preset name.
      filter_fn: as for `quantize_params`: `filter_fn(path, kernel) -> bool`.
      impl: the `lowp_jax.dot_general` branch.

    >>> import jax, jax.numpy as jnp, lowp_jax, lowp_jax.nnx
    >>> from flax import nnx
    >>> model = nnx.Sequential(nnx.Linear(64, 32, rngs=nnx.Rngs(0)), nnx.relu)
    >>> quantized = lowp_jax.nnx.quantize_model(model, "mxfp8")
    >>> type(quantized.layers[0].kernel[...]).__name__, quantized(jnp.ones((2, 64))).shape
    ('QArray', (2, 32))
    >>> isinstance(model.layers[0].kernel[...], jax.Array)  # the model passed in is unchanged
    True
    """
    config = _quantized_dot.as_config(config)
    graphdef, state = nnx.split(model)
    linears = {path for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Linear)}

    def chosen(path, kernel):
        # Only nnx.Linear layers get the quantized dot: another layer's rank-2 kernel
        # (nnx.LinearGeneral, nnx.Einsum) stays as it is, which it can still use.
        return tuple(path[:-1]) in linears and (filter_fn is None or filter_fn(path, kernel))

    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable(path, kernel) -> bool, got {filter_fn!r}")
    quantized = nnx.merge(graphdef, _params.quantize_params(state, config, chosen))
    dot = _quantized_dot.QuantizedDotGeneral(config, impl)
    for _, node in nnx.iter_graph(quantized):
        if isinstance(node, nnx.Linear) and isinstance(node.kernel[...], _qarray.QArray):
            node.dot_general = dot
            node.promote_dtype = promote_dtype
    return quantized


class GroupedExperts(nnx.Module):
    """E SwiGLU experts over tokens sorted by expert (spec §10): `silu(x w1_e) * (x w3_e)`,
    times w2_e, each a grouped GEMM, `lowp_jax.ragged_dot` with `recipe` or
    `jax.lax.ragged_dot` without. Weights in ragged_dot's (G, K, N) layout: w1, w3
    (E, dim, hidden), w2 (E, hidden, dim).

    >>> import jax.numpy as jnp, lowp_jax.nnx
    >>> from flax import nnx
    >>> experts = lowp_jax.nnx.GroupedExperts(32, 64, 2, recipe="mxfp8", rngs=nnx.Rngs(0))
    >>> experts(jnp.ones((5, 32)), jnp.array([2, 3])).shape
    (5, 32)
    """

    def __init__(
        self,
        dim: int,
        hidden: int,
        num_experts: int,
        *,
        recipe=None,
        rngs: nnx.Rngs,
        param_dtype=jnp.float32,
    ):
        init = jax.nn.initializers.truncated_normal

        def param(fan_in, shape):
            return nnx.Param(init(fan_in**-0.5)(rngs.params(), shape, param_dtype))

        self.w1 = param(dim, (num_experts, dim, hidden))
        self.w3 = param(dim, (num_experts, dim, hidden))
        self.w2 = param(hidden, (num_experts, hidden, dim))
        self.recipe = recipe

    def __call__(self, x, group_sizes):
        def mm(a, w):
            if self.recipe is None:
                return jax.lax.ragged_dot(a, w.astype(a.dtype), group_sizes)
            return _ragged_dot.ragged_dot(a, w, group_sizes, recipe=self.recipe)

        h = jax.nn.silu(mm(x, self.w1[...])) * mm(x, self.w3[...])
        return mm(h, self.w2[...])


__all__ = [
    "GroupedExperts",
    "Linear",
    "master_weight_promote_dtype",
    "promote_dtype",
    "quantize_model",
    "small_shapes_report",
]
