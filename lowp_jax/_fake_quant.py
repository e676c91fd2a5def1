"""Fake quantization with the straight-through estimator: quantize-dequantize forward,
identity backward."""

import functools

import jax

import lowp
from lowp_jax import _quantize


def fake_quantize(
    x, scheme: lowp.Scheme, *, rounding="nearest", random_bits=None, seed=None, offset=0
):
    """`dequantize(quantize(x, scheme, ...))`, bit for bit, with an identity gradient.

    `quantize` alone passes no gradient (it is piecewise constant). Quantization-aware
    training instead treats the rounding as the identity in the backward pass (the
    straight-through estimator): the derivative of the output with respect to `x` is 1
    everywhere, saturated and flushed elements included, as for JAX's own `astype` to
    float8. The output has x's dtype.

    >>> import jax, jax.numpy as jnp, lowp, lowp_jax
    >>> f = lambda x: lowp_jax.fake_quantize(x, lowp.TensorScaling()).sum()
    >>> jax.grad(f)(jnp.array([0.3, -2.0])).tolist()
    [1.0, 1.0]
    """
    _quantize.check_input(x, "input")  # before custom_jvp, which would make float64 float32
    random = _quantize.random_for(jax.numpy.shape(x), rounding, random_bits, seed, offset, "input")
    return _straight_through(scheme, rounding, x, random)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _straight_through(scheme, rounding, x, random):
    if random is None:
        return _quantize.dequantize(_quantize.quantize(x, scheme))
    return _quantize.dequantize(
        _quantize.quantize(x, scheme, rounding=rounding, random_bits=random)
    )


@_straight_through.defjvp
def _straight_through_jvp(scheme, rounding, primals, tangents):
    x, random = primals
    x_dot, _ = tangents
    return _straight_through(scheme, rounding, x, random), x_dot
