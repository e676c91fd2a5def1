"""flax linen layers on lowp_jax's quantized dot.

`flax.linen.Dense(dot_general_cls=lowp_jax.dot_general_cls(config))` quantizes a
high-precision kernel at each call. For kernels that are already QArrays (from
`lowp_jax.quantize_params` or `lowp_jax.load_quantized`), apply a model written with
plain `nn.Dense` layers inside `with quantized(config):`, which runs every Dense whose
kernel is a QArray on lowp's dot (linen's own Dense would check the stored parameter
against the (in, out) shape it initializes, which a QArray's (out, in) codes are not),
or build the model with `Dense` here. For training,
`flax.linen.Dense(dot_general_cls=lowp_jax.training_dot_general_cls(recipe))` or
`Dense(features, recipe=recipe)` here.
"""

import contextlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from lowp_jax import _qarray, _quantized_dot, _training


def promote_dtype(*args, dtype=None, inexact=True):
    """`flax.linen.dtypes.promote_dtype` that leaves QArrays quantized (their `hp_dtype`
    follows the promotion)."""
    return _quantized_dot.promote(args, dtype, inexact)


class Dense(nn.Module):
    """`flax.linen.Dense` whose matmul quantizes with a `lowp.InferenceConfig` (inference)
    or a `lowp.Recipe` (training).

    The `kernel` parameter is (in, out) when high precision, as in nn.Dense, or a
    QArray (out, in) put there by `lowp_jax.quantize_params` (a Dense with a config).

    Attributes:
      features: the number of output features.
      config: the InferenceConfig or preset name, for inference.
      recipe: instead of config, the training Recipe or recipe name
        (`lowp_jax.TrainingDotGeneral`).
      impl: the `lowp_jax.dot_general` branch ("auto").
      small_shapes: with recipe, "auto" (the small-shape policy of
        `lowp_jax.training_dot_general`) or "quantize" (always the recipe).
      use_bias, dtype, param_dtype, precision, kernel_init, bias_init: as nn.Dense.

    >>> import jax, jax.numpy as jnp, lowp_jax, lowp_jax.linen
    >>> dense = lowp_jax.linen.Dense(8, config="nvfp4")
    >>> params = lowp_jax.quantize_params(dense.init(jax.random.key(0), jnp.ones((1, 64))), "nvfp4")
    >>> dense.apply(params, jnp.ones((2, 64))).shape
    (2, 8)
    """

    features: int
    config: Any = None
    recipe: Any = None
    impl: str = "auto"
    use_bias: bool = True
    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros_init()
    small_shapes: str = "auto"  # last: the fields before keep their positions

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        in_features = jnp.shape(inputs)[-1]
        kernel = (
            self.get_variable("params", "kernel") if self.has_variable("params", "kernel") else None
        )
        if isinstance(kernel, _qarray.QArray):
            if kernel.shape != (self.features, in_features):
                raise ValueError(
                    f"{self.path}: the QArray kernel is {kernel.shape}, expected (out, in) = "
                    f"{(self.features, in_features)}"
                )
        else:
            kernel = self.param(
                "kernel", self.kernel_init, (in_features, self.features), self.param_dtype
            )
        bias = (
            self.param("bias", self.bias_init, (self.features,), self.param_dtype)
            if self.use_bias
            else None
        )
        promoted_inputs, promoted_kernel, bias = promote_dtype(
            inputs, kernel, bias, dtype=self.dtype
        )
        # A high-precision kernel is quantized in its parameter dtype, the master weight
        # itself (see lowp_jax.nnx.master_weight_promote_dtype); a QArray is promoted.
        inputs = promoted_inputs
        kernel = promoted_kernel if isinstance(kernel, _qarray.QArray) else kernel
        dot = _training.layer_dot_general(self.config, self.recipe, self.impl, self.small_shapes)
        y = dot(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), precision=self.precision)
        if bias is not None:
            y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y


@contextlib.contextmanager
def quantized(config, impl: str = "auto"):
    """Inside the block, every `flax.linen.Dense` whose kernel is a QArray runs lowp's
    quantized dot: a model written with plain `nn.Dense` layers applies the parameters
    `lowp_jax.quantize_params` (or `load_quantized`) made, unchanged.

    A Dense with a high-precision kernel runs as linen runs it. The QArray kernel is
    (out, in) (spec §9); the input is quantized with `config.activation` at each call
    (none: weight-only), the bias added in the input's dtype, as `Dense` here does. The
    interception happens while the model is traced: jit the function that calls
    `apply` inside the block (a function traced outside it runs linen's Dense).

    Args:
      config: the `lowp.InferenceConfig` or preset name the kernels were quantized with;
        a kernel quantized with another weight scheme is refused, naming the layer.
      impl: the `lowp_jax.dot_general` branch ("auto").

    >>> import jax, jax.numpy as jnp, flax.linen as nn, lowp_jax, lowp_jax.linen
    >>> model = nn.Sequential([nn.Dense(64), nn.relu, nn.Dense(8)])
    >>> params = model.init(jax.random.key(0), jnp.ones((1, 32)))
    >>> qparams = lowp_jax.quantize_params(params, "mxfp8")
    >>> with lowp_jax.linen.quantized("mxfp8"):
    ...     y = model.apply(qparams, jnp.ones((2, 32)))
    >>> y.shape
    (2, 8)
    """
    dot = _quantized_dot.QuantizedDotGeneral(config, impl)

    def run_quantized(next_fun, args, kwargs, context):
        module = context.module
        if (
            context.method_name != "__call__"
            or not isinstance(module, nn.Dense)
            or not module.has_variable("params", "kernel")
            or not isinstance(module.get_variable("params", "kernel"), _qarray.QArray)
        ):
            return next_fun(*args, **kwargs)
        (inputs,) = args
        kernel = module.get_variable("params", "kernel")
        in_features = jnp.shape(inputs)[-1]
        if kernel.shape != (module.features, in_features):
            raise ValueError(
                f"{'/'.join(module.path)}: the QArray kernel is {kernel.shape}, expected "
                f"(out, in) = {(module.features, in_features)}"
            )
        bias = module.get_variable("params", "bias") if module.use_bias else None
        inputs, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=module.dtype)
        try:
            y = dot(
                inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())), precision=module.precision
            )
        except ValueError as err:  # a kernel quantized with another scheme: name the layer
            where = "/".join(module.path) or type(module).__name__
            raise ValueError(f"{where}: {err}") from None
        if bias is not None:
            y += jnp.reshape(bias, (1,) * (y.ndim - 1) + (-1,))
        return y

    with nn.intercept_methods(run_quantized):
        yield


__all__ = ["Dense", "promote_dtype", "quantized"]
