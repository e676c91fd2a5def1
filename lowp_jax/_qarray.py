"""QArray: a quantized JAX array as a pytree of codes and scales plus static metadata.

The leaves are the arrays (codes, scale, global_scale); the scheme, logical shape,
high-precision dtype and scale layout are static auxiliary data, so a QArray passes
through `jit`, `grad`, `vmap` and sharding like any pytree, and a change of scheme or
shape means a recompile, as a change of shape does for an array.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import lowp
from lowp import extend
from lowp_jax import _layouts

# How each format's bytes are stored: e4m3/e5m2 codes (and NVFP4's e4m3 block scales)
# as JAX's own float8 dtypes, a bitcast of the code bytes, so XLA's fp8 GEMMs take them
# as they are; float6 one code a byte and float4 two a byte, as uint8. MX's e8m0 scales
# are uint8 too, although jnp.float8_e8m0fnu exists (jax 0.10 and 0.11): e8m0 has no
# zero, so the zero cotangent JAX builds for such a leaf under `grad` reads NaN
# (measured, jax 0.10.2), and a uint8 leaf gets float0 instead, JAX's "no gradient";
# jax.nn.scaled_matmul's e8m0 operand is a free bitcast away.
_STORAGE = {
    "float8_e4m3fn": jnp.float8_e4m3fn,
    "float8_e5m2": jnp.float8_e5m2,
    "float6_e2m3fn": jnp.uint8,
    "float6_e3m2fn": jnp.uint8,
    "float4_e2m1fn": jnp.uint8,
    "float8_e8m0fnu": jnp.uint8,
    "float32": jnp.float32,
}


def storage_dtype(fmt: str):
    """The JAX dtype that holds codes or scales of format `fmt`."""
    return _STORAGE[fmt]


def store(byte_array, fmt: str):
    """uint8 code bytes (JAX or NumPy) as the storage dtype of `fmt`, bit for bit."""
    dtype = _STORAGE[fmt]
    if isinstance(byte_array, np.ndarray):
        return jnp.asarray(byte_array.view(np.dtype(dtype)))
    return jax.lax.bitcast_convert_type(byte_array, dtype) if dtype != jnp.uint8 else byte_array


def code_bytes(stored) -> jnp.ndarray:
    """Stored codes or 8-bit scales back as uint8 bytes (a bitcast)."""
    if stored.dtype == jnp.uint8:
        return stored
    return jax.lax.bitcast_convert_type(stored, jnp.uint8)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class QArray:
    """Codes and scales of a quantized JAX array (spec §3, §5, §9); a pytree.

    Attributes:
      codes: the element codes. float8_e4m3fn / float8_e5m2 dtype for those formats,
        uint8 for float6 (one code a byte) and float4 (two a byte along the last axis,
        element 2j in bits 3..0). Shape: `shape`, last dim halved for float4.
      scale: float32 decode scales (Tensor/Axis/Block scaling), uint8 e8m0 bytes (MX) or
        float8_e4m3fn (NVFP4) block scales; plain shape `scheme.scale_shape(shape)`, or
        the padded 2-D matrix of the "cublas_blocked" layout.
      global_scale: NVFP4's float32 per-tensor decode scale (0-d), else None.
      scheme, shape, hp_dtype, scale_layout: static metadata, as in `lowp.QTensor`.

    Transformations:
      jit: a QArray is an argument or result like any pytree; its metadata is part of the
        cache key.
      grad: `quantize` and `dequantize` are piecewise constant, so they pass no gradient:
        `dequantize(q)` is a constant with respect to q's leaves, and `quantize(x)` stops
        the gradient of x. Gradients flow through the other inputs of a function that uses
        a dequantized value (e.g. a matmul with a high-precision operand). For the
        straight-through estimator use `lowp_jax.fake_quantize`. `jax.grad` itself
        refuses integer inputs: a QArray with uint8 leaves (fp4 and fp6 codes, MX scale
        bytes) must not be among the arguments it differentiates (pick `argnums`, or in
        nnx leave quantized kernels out with `nnx.DiffState(0, filter)`); float8 leaves
        get zero gradients, uint8 ones float0 under `jax.vjp`.
      vmap: quantize and dequantize map over a leading batch axis for every scheme, each
        example quantized on its own; the QArray built inside carries the per-example
        `shape`, and its leaves gain the batch axis outside (use it under the same vmap).
        This equals quantizing the whole batch only where no group spans the batch axis:
        AxisScaling (along a per-example axis), BlockScaling, MXScaling and NVFP4Scaling
        with `global_scale=False`. TensorScaling and NVFP4 with a global scale get one
        scale per example instead of one per batch, and stochastic rounding with one
        `seed` for all examples hashes per-example indices, so every example draws the
        same bits: batch the seed (or offset), or pass `random_bits` shaped like the batch.

    Construct it with `lowp_jax.quantize` or `from_lowp`; the constructor checks every
    field against the others (leaves are not checked when JAX rebuilds the pytree).

    >>> import jax, jax.numpy as jnp, lowp, lowp_jax
    >>> quantize = jax.jit(lambda x: lowp_jax.quantize(x, lowp.MXScaling(mode="rceil")))
    >>> q = quantize(jnp.full((2, 32), 3.0))
    >>> q.codes.dtype, q.scale.dtype, q.scale.shape
    (dtype(float8_e4m3fn), dtype('uint8'), (2, 1))
    >>> jax.jit(lowp_jax.dequantize)(q)[0, :2].tolist()
    [3.0, 3.0]
    """

    codes: jax.Array
    scale: jax.Array
    global_scale: jax.Array | None
    scheme: lowp.Scheme
    shape: tuple[int, ...]
    hp_dtype: str
    scale_layout: str = "plain"

    def __post_init__(self):
        layout = extend.check_layout(
            "QArray", self.scheme, self.shape, self.hp_dtype, self.scale_layout
        )
        _expect("codes", self.codes, _STORAGE[self.scheme.fmt], layout.codes_shape)
        _expect("scale", self.scale, _STORAGE[layout.scale_format], layout.scale_shape)
        if layout.has_global_scale:
            _expect("global_scale", self.global_scale, jnp.float32, ())
        elif self.global_scale is not None:
            raise ValueError(f"QArray.global_scale must be None for {self.scheme}")

    def tree_flatten(self):
        """The JAX pytree protocol: the arrays (codes, scale, global_scale) are the leaves;
        scheme, shape, hp_dtype and scale_layout the static aux data."""
        return (self.codes, self.scale, self.global_scale), (
            self.scheme,
            self.shape,
            self.hp_dtype,
            self.scale_layout,
        )

    @classmethod
    def tree_unflatten(cls, aux, leaves):
        """The JAX pytree protocol: the QArray of `tree_flatten`'s aux data and leaves."""
        # JAX rebuilds pytrees with placeholders and batched leaves: no checks here.
        obj = object.__new__(cls)
        for field, value in zip(("codes", "scale", "global_scale"), leaves, strict=False):
            object.__setattr__(obj, field, value)
        for field, value in zip(("scheme", "shape", "hp_dtype", "scale_layout"), aux, strict=False):
            object.__setattr__(obj, field, value)
        return obj

    @property
    def ndim(self) -> int:
        """The rank of the high-precision array, `len(shape)`."""
        return len(self.shape)

    @property
    def fmt(self) -> str:
        """The element format's name."""
        return self.scheme.fmt

    @property
    def nbytes(self) -> int:
        """The bytes stored: codes, scales and the global scale, if any."""
        extra = 0 if self.global_scale is None else self.global_scale.nbytes
        return self.codes.nbytes + self.scale.nbytes + extra

    def dequantize(self, out_dtype=None) -> jax.Array:
        """Shorthand for `lowp_jax.dequantize(self, out_dtype)`."""
        from lowp_jax import _quantize

        return _quantize.dequantize(self, out_dtype)

    def __getitem__(self, index):
        """`q[...]` is q itself: flax nnx reads a parameter as `param[...]`, so a QArray
        kernel can sit in an `nnx.Linear`. Any other index needs values: dequantize first."""
        if index is Ellipsis:
            return self
        raise TypeError(
            f"a QArray supports only q[...] (the whole array); index its values with "
            f"q.dequantize()[{index!r}]"
        )

    def with_scale_layout(self, layout: str) -> "QArray":
        """The same array with its scales in `layout` ("plain" or "cublas_blocked")."""
        if layout == self.scale_layout:
            return self
        extend.stored_scale_shape(self.scheme, self.shape, layout)  # validates the layout applies
        rows, cols = extend.blocked_matrix_shape(self.scheme, self.shape)
        scale = code_bytes(self.scale)
        if layout == "cublas_blocked":
            scale = _layouts.to_cublas_blocked(scale.reshape(rows, cols))
        else:
            scale = _layouts.from_cublas_blocked(scale, rows, cols).reshape(
                self.scheme.scale_shape(self.shape)
            )
        scale = store(scale, extend.scale_format(self.scheme))
        return dataclasses.replace(self, scale=scale, scale_layout=layout)

    def __jax_array__(self):
        # jnp.asarray(q) and every jnp function given a QArray land here: refuse with the
        # way out, instead of JAX's "dtype object is not a valid JAX array type".
        raise TypeError(
            f"a lowp_jax.QArray ({self.scheme}, shape {self.shape}) holds codes and scales, "
            "not an array: lowp_jax.dequantize(q) gives its values. A flax layer given QArray "
            "kernels must run lowp's dot and leave them quantized: convert the model with "
            "lowp_jax.nnx.quantize_model(model, config), apply a linen model inside "
            "`with lowp_jax.linen.quantized(config):`, or give the layer "
            "dot_general=lowp_jax.QuantizedDotGeneral(config) and "
            "promote_dtype=lowp_jax.nnx.promote_dtype"
        )

    def __repr__(self):
        def leaf(value):  # after jax.tree.map the leaves may be anything (None, a spec, ...)
            if hasattr(value, "dtype") and hasattr(value, "shape"):
                return f"{value.dtype}{list(value.shape)}"
            return repr(value)

        return (
            f"QArray(shape={self.shape}, hp_dtype={self.hp_dtype!r}, scheme={self.scheme}, "
            f"codes={leaf(self.codes)}, scale={leaf(self.scale)}, scale_layout={self.scale_layout!r})"
        )


def _expect(field, value, dtype, shape) -> None:
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        raise TypeError(f"QArray.{field} must be an array, got {type(value).__name__}")
    if value.dtype != dtype:
        raise TypeError(f"QArray.{field} must be {np.dtype(dtype).name}, got {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"QArray.{field} must have shape {tuple(shape)}, got {tuple(value.shape)}")


def to_lowp(q: QArray) -> lowp.QTensor:
    """The NumPy `lowp.QTensor` holding exactly q's bytes (a device-to-host copy)."""
    if not isinstance(q, QArray):
        raise TypeError(f"to_lowp takes a lowp_jax.QArray, got {type(q).__name__}")
    codes = np.asarray(jax.device_get(q.codes))
    scale = np.asarray(jax.device_get(q.scale))
    if scale.dtype != np.float32:
        scale = scale.view(np.uint8)
    global_scale = None
    if q.global_scale is not None:
        global_scale = np.asarray(jax.device_get(q.global_scale), dtype=np.float32).reshape(())
    return lowp.QTensor(
        codes=np.array(codes.view(np.uint8), order="C"),
        scale=np.array(scale, order="C"),  # (ascontiguousarray would make a 0-d scale 1-d)
        global_scale=global_scale,
        scheme=q.scheme,
        shape=q.shape,
        hp_dtype=q.hp_dtype,
        scale_layout=q.scale_layout,
    )


def from_lowp(qt: lowp.QTensor) -> QArray:
    """A QArray holding exactly the bytes of the NumPy `lowp.QTensor` qt (on the default device)."""
    if not isinstance(qt, lowp.QTensor):
        raise TypeError(f"from_lowp takes a lowp.QTensor, got {type(qt).__name__}")
    extend.refuse_origin(qt, "from_lowp", "lowp_jax.dequantize_checkpoint(q)")
    scale_fmt = extend.scale_format(qt.scheme)
    return QArray(
        codes=store(qt.codes, qt.scheme.fmt),
        scale=store(qt.scale, scale_fmt) if scale_fmt != "float32" else jnp.asarray(qt.scale),
        global_scale=None if qt.global_scale is None else jnp.asarray(qt.global_scale, jnp.float32),
        scheme=qt.scheme,
        shape=qt.shape,
        hp_dtype=qt.hp_dtype,
        scale_layout=qt.scale_layout,
    )
