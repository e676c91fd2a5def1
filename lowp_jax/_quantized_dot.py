"""`QuantizedDotGeneral`: lowp_jax's dot as the `dot_general` callable flax layers take.

flax's Dense/Linear compute `dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))`
with the kernel stored (in, out). A QArray kernel is stored the other way, (out, in) =
(N, K), quantized along K, as spec §9 writes linear weights and `quantize_params` makes
them, so this callable reads flax's dimension numbers against the kernel's transpose.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

import lowp
from lowp_jax import _dot, _qarray


def as_config(config) -> lowp.InferenceConfig:
    """A `lowp.InferenceConfig` from itself or a preset name; TypeError otherwise."""
    if isinstance(config, str):
        return lowp.InferenceConfig.from_name(config)
    if not isinstance(config, lowp.InferenceConfig):
        raise TypeError(
            f"expected a lowp.InferenceConfig or a preset name {lowp.InferenceConfig.names()}, "
            f"got {config!r}"
        )
    return config


@dataclasses.dataclass(frozen=True)
class QuantizedDotGeneral:
    """A `dot_general` for flax layers that quantizes with a `lowp.InferenceConfig`.

    The activation is quantized at each call with `config.activation` (or left in high
    precision if None). The kernel is either a high-precision flax kernel (in, out),
    transposed to (out, in) and quantized along `in` with `config.weight` at each call,
    or a QArray stored (out, in) (from `lowp_jax.quantize_params` or
    `lowp_jax.load_quantized`), used as it is. `lowp_jax.dot_general` does the rest. With
    a high-precision kernel the product has the input's dtype (unless
    `preferred_element_type` says otherwise): the layers keep a float32 master kernel
    in its dtype under `dtype=bfloat16`, to quantize it once.

    Hashable and a static pytree node (no leaves), so it can sit in an nnx module or a
    linen module's fields and cross `jit` as part of the module's structure.

    Attributes:
      config: the InferenceConfig, or a preset name ("float8_rowwise", "mxfp8", ...).
      impl: the `dot_general` branch, "auto" by default (see `lowp_jax.dot_general`).

    >>> import jax.numpy as jnp, lowp_jax
    >>> from flax import nnx
    >>> layer = nnx.Linear(64, 8, dot_general=lowp_jax.QuantizedDotGeneral("float8_rowwise"),
    ...                    rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((2, 64))).shape
    (2, 8)
    """

    config: lowp.InferenceConfig
    impl: str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "config", as_config(self.config))
        if self.impl not in _dot.IMPLS:
            raise ValueError(f"impl must be one of {_dot.IMPLS}, got {self.impl!r}")

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
            raise NotImplementedError("QuantizedDotGeneral does not take out_sharding yet")
        if isinstance(rhs, _qarray.QArray):
            rhs_contract = tuple(dimension_numbers[0][1])
            if rhs.ndim != 2 or len(rhs_contract) != 1 or rhs_contract[0] not in (0, 1):
                raise ValueError(
                    f"a QArray kernel is a rank-2 (out, in) weight contracted along one dim; got "
                    f"shape {rhs.shape} and rhs contracting dims {rhs_contract}"
                )
            if rhs.scheme != self.config.weight:
                raise ValueError(
                    f"the QArray kernel was quantized with {rhs.scheme}, but this layer's "
                    f"config quantizes weights with {self.config.weight}: give the layer the "
                    "config its kernels were quantized with (the one given to "
                    "lowp_jax.quantize_params)"
                )
            # flax names the kernel's dims as (in, out); the QArray holds (out, in).
            (lhs_contract, _), batch = dimension_numbers
            dimension_numbers = ((lhs_contract, (1 - rhs_contract[0],)), batch)
        elif preferred_element_type is None and not isinstance(lhs, _qarray.QArray):
            # A kernel in another dtype than the input is a master weight the layer kept
            # in its parameter dtype (`lowp_jax.nnx.master_weight_promote_dtype`): the
            # product has the input's dtype, as flax's promoted dot would.
            preferred_element_type = jnp.result_type(lhs)
        return _dot.dot_general(
            lhs,
            rhs,
            dimension_numbers,
            precision,
            preferred_element_type,
            config=self.config,
            impl=self.impl,
        )


jax.tree_util.register_static(QuantizedDotGeneral)


def dot_general_cls(config, impl: str = "auto"):
    """What `flax.linen.Dense(dot_general_cls=...)` takes: a zero-argument callable that
    returns a `QuantizedDotGeneral(config, impl)` (linen calls `dot_general_cls()` at
    each application).

    >>> import jax, jax.numpy as jnp, flax.linen as nn, lowp_jax
    >>> dense = nn.Dense(8, dot_general_cls=lowp_jax.dot_general_cls("mxfp8"))
    >>> params = dense.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> dense.apply(params, jnp.ones((2, 64))).shape
    (2, 8)
    """
    return functools.partial(QuantizedDotGeneral, as_config(config), impl)


def promote(args, dtype=None, inexact: bool = True) -> tuple:
    """flax's `promote_dtype` with QArrays: every array is cast to one dtype (`dtype`, or
    the promotion of the arrays' dtypes, a QArray counting as its `hp_dtype`), and a
    QArray keeps its codes and scales, its `hp_dtype` (the dtype it dequantizes to)
    becoming that dtype. None stays None."""
    dtypes = [
        jnp.dtype(a.hp_dtype) if isinstance(a, _qarray.QArray) else jnp.result_type(a)
        for a in args
        if a is not None
    ]
    if dtype is None:
        dtype = jnp.result_type(*dtypes)
        if inexact and not jnp.issubdtype(dtype, jnp.inexact):
            dtype = jnp.promote_types(jnp.float32, dtype)
    name = jnp.dtype(dtype).name
    out = []
    for a in args:
        if a is None:
            out.append(None)
        elif isinstance(a, _qarray.QArray):
            out.append(a if a.hp_dtype == name else dataclasses.replace(a, hp_dtype=name))
        else:
            out.append(jnp.asarray(a, dtype))
    return tuple(out)
