"""flax linen layers on lowp_jax's quantized dot.

`flax.linen.Dense(dot_general_cls=lowp_jax.dot_general_cls(config))` quantizes a
high-precision kernel at each call. For kernels that are already QArrays (from
`lowp_jax.quantize_params` or `lowp_jax.load_quantized`) use `Dense` here: linen's
own Dense checks a stored parameter against the (in, out) shape it would initialize,
which a QArray's (out, in) codes are not. For training,
`flax.linen.Dense(dot_general_cls=lowp_jax.training_dot_general_cls(recipe))` or
`Dense(features, recipe=recipe)` here.
"""

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


__all__ = ["Dense", "promote_dtype"]
