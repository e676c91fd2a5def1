"""flax nnx layers on lowp_jax's quantized dot.

`Linear` is `flax.nnx.Linear` with a QArray-aware `promote_dtype` and, for inference, a
`QuantizedDotGeneral` (its kernel high precision, quantized at each call, or a QArray
(out, in) from `lowp_jax.quantize_params`) or, for training, a `TrainingDotGeneral`.
`quantize_model` converts an existing model's `nnx.Linear` layers for inference.
`GroupedExperts` is an MoE layer's stacked SwiGLU experts on `lowp_jax.ragged_dot`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

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
]
