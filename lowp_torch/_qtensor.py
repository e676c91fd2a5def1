"""QuantizedTensor: a torch.Tensor subclass holding codes, scales and the scheme.

To torch it looks like the high-precision tensor it stands for: its shape is the
logical shape and its dtype `hp_dtype`. Its data lives in plain inner tensors (`codes`,
`scale`, `global_scale`), so it is a wrapper subclass: `__torch_dispatch__` says what
each aten op means for codes and scales, and `__tensor_flatten__` /
`__tensor_unflatten__` let torch.compile trace through it.

`F.linear` is caught one level higher, in `__torch_function__`: at the aten level it
decomposes into a transpose of the weight and an `addmm`, and a transpose of packed
fp4 codes has no quantized form (see `_tensor_ops.permute`).

The scheme and the LinearConfig are stored as tuples of Python literals (`_scheme_key`,
`_linear_key`) and rebuilt on access. Why: when torch.compile traces code that *creates*
a QuantizedTensor (quantizing an activation inside a compiled model), Dynamo reads that
tensor's attributes as constants and can wrap only literals and tuples of them, not a
dataclass (torch 2.13: "SourcelessBuilder.create does not know how to wrap
TensorScaling"). Code that may run under torch.compile therefore reads them through
`scheme_of(q)` / `linear_of(q)` and calls the module functions (`replace`,
`with_scale_layout`), never the properties or methods, which are for users.
"""

import dataclasses
import hashlib

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing

import lowp
from lowp import extend
from lowp_torch import _config, _layouts, _storage

aten = torch.ops.aten

_FIELDS = (
    "codes",
    "scale",
    "global_scale",
    "scheme",
    "shape",
    "hp_dtype",
    "scale_layout",
    "linear",
)
_SCHEME_KINDS = {cls.__name__: cls for cls in extend.SCHEME_TYPES}
_FIELD_NAMES = {
    cls: tuple(f.name for f in dataclasses.fields(cls))
    for cls in (*extend.SCHEME_TYPES, _config.LinearConfig)
}
_DECODED: dict = {}  # key -> scheme or LinearConfig, filled in eager mode only


class QuantizedTensor(torch.Tensor):
    """Codes and scales of a quantized tensor (spec §3, §5, §9), on one device.

    Attributes:
      codes: the element codes, shaped like the input, except float4: last dim halved.
        dtype `float8_e4m3fn` / `float8_e5m2` (fp8), `uint8` (float6, one code a byte)
        or `float4_e2m1fn_x2` (two codes a byte, element 2j in bits 3..0).
      scale: the scheme's scales: float32 decode scales (Tensor/Axis/Block scaling),
        `float8_e8m0fnu` (MX) or `float8_e4m3fn` (NVFP4 block scales); plain shape
        `scheme.scale_shape(shape)`, or the padded 2-D matrix for "cublas_blocked".
      global_scale: NVFP4's float32 per-tensor decode scale (0-d), else None.
      scheme: the lowp scheme the tensor was quantized with.
      shape: logical shape of the high-precision tensor (a torch.Size, as for any tensor).
      hp_dtype: torch.float32, torch.bfloat16 or torch.float16: what dequantize returns
        by default, and this tensor's `dtype`.
      scale_layout: "plain" or "cublas_blocked" (MX/NVFP4 blocked along the last axis).
      linear: a `LinearConfig` when `quantize_` made this a layer's weight (activation
        scheme, kernel choice, padding, name), else None.

    The fields are read-only; `replace(**changes)` makes a new tensor. Construction
    checks every field against the others (shapes and dtypes only, so it costs no
    device sync). The tensor never requires grad: codes have no gradient.

    >>> import torch, lowp, lowp_torch
    >>> q = lowp_torch.quantize(torch.tensor([1.0, -2.0, 448.0]), lowp.TensorScaling())
    >>> q.codes.view(torch.uint8).tolist(), q.scale.item(), q.shape, q.dtype
    ([56, 192, 126], 1.0, torch.Size([3]), torch.float32)
    """

    codes: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None
    hp_dtype: torch.dtype
    scale_layout: str

    @staticmethod
    def __new__(
        cls,
        codes: torch.Tensor,
        scale: torch.Tensor,
        global_scale: torch.Tensor | None,
        scheme: lowp.Scheme,
        shape,
        hp_dtype: torch.dtype,
        scale_layout: str = "plain",
        linear: _config.LinearConfig | None = None,
    ):
        shape = _check_fields(
            codes, scale, global_scale, scheme, shape, hp_dtype, scale_layout, linear
        )
        return _build(
            cls, codes, scale, global_scale, scheme, shape, hp_dtype, scale_layout, linear
        )

    @property
    def scheme(self) -> lowp.Scheme:
        """The lowp scheme the tensor was quantized with."""
        return scheme_of(self)

    @property
    def linear(self) -> _config.LinearConfig | None:
        """The `LinearConfig` `quantize_` gave this weight (activation scheme, kernel,
        padding, name), or None for a tensor that is no layer's weight."""
        return linear_of(self)

    def __setattr__(self, name, value):
        if name in _FIELDS:  # the quantized fields are fixed, as in a frozen dataclass
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super().__setattr__(name, value)

    def __reduce_ex__(self, protocol):
        # Pickle (torch.save) as a call of the constructor, so a load re-checks every
        # field; torch's default for wrapper subclasses would set attributes on a bare
        # wrapper. The arguments are tensors, lowp schemes, a LinearConfig and builtins,
        # all allowlisted for torch.load(weights_only=True) in lowp_torch/__init__.py.
        args = (
            self.codes,
            self.scale,
            self.global_scale,
            scheme_of(self),
            tuple(self.shape),
            self.hp_dtype,
            self.scale_layout,
            linear_of(self),
        )
        return (QuantizedTensor, args)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor holds: its codes, scales and global scale (torch's own
        `nbytes` would count `hp_dtype` elements of the logical shape)."""
        parts = (self.codes, self.scale, self.global_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def replace(self, **changes) -> "QuantizedTensor":
        """A new QuantizedTensor with `changes` applied to the fields (re-checked)."""
        return replace(self, **changes)

    def dequantize(self, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Shorthand for `lowp_torch.dequantize(self, out_dtype)` (a plain tensor)."""
        from lowp_torch import _quantize  # _quantize builds QuantizedTensors

        return _quantize.dequantize(self, out_dtype)

    def with_scale_layout(self, layout: str) -> "QuantizedTensor":
        """The same tensor with its scales in `layout` ("plain" or "cublas_blocked").

        The blocked layout is the padded 2-D matrix cuBLAS block-scaled GEMMs read
        (spec §5); it applies to MX and NVFP4 scales blocked along the last axis.
        """
        return with_scale_layout(self, layout)

    def __repr__(self, *, tensor_contents=None):
        linear = "" if self._linear_key is None else f", linear={self.linear}"
        return (
            f"QuantizedTensor(shape={tuple(self.shape)}, hp_dtype={self.hp_dtype}, "
            f"scheme={self.scheme}, codes={self.codes.dtype}{list(self.codes.shape)}, "
            f"scale={self.scale.dtype}{list(self.scale.shape)}, "
            f"scale_layout={self.scale_layout!r}, device={self.device}{linear})"
        )

    # --- torch.compile: the inner tensors and the static metadata ---

    def __tensor_flatten__(self):
        inner = ["codes", "scale"] + ([] if self.global_scale is None else ["global_scale"])
        return inner, (self._scheme_key, self.hp_dtype, self.scale_layout, self._linear_key)

    @staticmethod
    def __tensor_unflatten__(inner_tensors, metadata, outer_size, outer_stride):
        scheme_key, hp_dtype, scale_layout, linear_key = metadata
        return QuantizedTensor(
            inner_tensors["codes"],
            inner_tensors["scale"],
            inner_tensors.get("global_scale"),
            _decode(scheme_key),
            outer_size,
            hp_dtype,
            scale_layout,
            None if linear_key is None else _decode(linear_key),
        )

    def _stable_hash_for_caching(self) -> str:
        """Key for torch.compile's AOT autograd cache: metadata and inner tensor layouts."""
        inner, metadata = self.__tensor_flatten__()
        parts = [repr(metadata), repr(tuple(self.shape))]
        for name in inner:
            t = getattr(self, name)
            parts.append(f"{name}:{t.dtype}:{tuple(t.shape)}:{t.stride()}:{t.device.type}")
        return hashlib.blake2b("|".join(parts).encode(), digest_size=16).hexdigest()

    # --- what torch ops mean for a quantized tensor ---

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            from lowp_torch import _linear

            return _linear.linear(*args, **kwargs)
        if func is torch.Tensor.storage:  # safetensors' fallback, after untyped_storage
            raise TypeError(
                "a lowp_torch.QuantizedTensor has no single storage (it is codes, scales and "
                "a scheme), so safetensors cannot write it: save a quantized transformers "
                "model with lowp_torch.save_pretrained(model, directory) (docs/transformers.md), "
                "any other module with lowp_torch.save_quantized(model, path)"
            )
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        """One branch per aten op a model needs; anything else raises, naming the op.

        Shape ops keep codes and scales together and refuse (or, for a transpose that
        has no quantized form, dequantize) where a scale group would be split; the
        rules are in `_tensor_ops`. GEMMs go to `_linear`, which calls `scaled_matmul`.
        """
        from lowp_torch import _linear, _tensor_ops

        kwargs = kwargs or {}
        q = args[0]
        if func in (aten.detach.default, aten.alias.default):
            out = replace(q, codes=q.codes.detach(), scale=q.scale.detach())
            return return_and_correct_aliasing(func, args, kwargs, out)
        elif func is aten.clone.default:  # .contiguous() is a clone with a memory_format
            memory_format = (kwargs or {}).get("memory_format", torch.preserve_format)
            return _tensor_ops.map_parts(q, lambda t: torch.clone(t, memory_format=memory_format))
        elif func is aten._to_copy.default:
            return _tensor_ops.to_copy(q, **kwargs)
        elif func is aten.copy_.default:
            return _tensor_ops.copy_(args[0], args[1])
        elif func is aten.is_pinned.default:
            return q.codes.is_pinned()
        elif func is aten._pin_memory.default:
            return _tensor_ops.map_parts(q, lambda t: t.pin_memory())
        elif func in (aten.t.default, aten.transpose.int, aten.permute.default):
            dims = _tensor_ops.permutation(func, q.dim(), args[1:])
            return _keep_aliasing(func, args, kwargs, _tensor_ops.permute(q, dims, op=func.name()))
        elif func in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            return _keep_aliasing(
                func, args, kwargs, _tensor_ops.reshape(q, args[1], op=func.name())
            )
        elif func is aten.slice.Tensor:
            return _keep_aliasing(func, args, kwargs, _tensor_ops.slice_(q, *args[1:], **kwargs))
        elif func is aten.select.int:
            return _keep_aliasing(func, args, kwargs, _tensor_ops.select(q, *args[1:]))
        elif func in (aten.split.Tensor, aten.split_with_sizes.default):
            return _keep_aliasing(func, args, kwargs, _tensor_ops.split(q, *args[1:], **kwargs))
        elif func is aten.cat.default:
            return _tensor_ops.cat(*args, **kwargs)
        elif func is aten.mm.default:
            return _linear.matmul(args[0], args[1])
        elif func is aten.addmm.default:
            return _linear.addmm(*args, **kwargs)
        elif func is aten.bmm.default:
            return _linear.matmul(args[0], args[1])
        elif func is aten.linear.default:
            return _linear.linear(*args, **kwargs)
        raise NotImplementedError(
            f"lowp_torch.QuantizedTensor does not implement {func.name()}; "
            "call .dequantize() to get a plain tensor first"
        )


def scheme_of(q: QuantizedTensor) -> lowp.Scheme:
    """`q.scheme`, in a form torch.compile can trace (see the module docstring)."""
    return _decode(q._scheme_key)


def linear_of(q: QuantizedTensor) -> _config.LinearConfig | None:
    """`q.linear`, in a form torch.compile can trace."""
    return None if q._linear_key is None else _decode(q._linear_key)


def replace(q: QuantizedTensor, **changes) -> QuantizedTensor:
    """A new QuantizedTensor with `changes` applied to q's fields (re-checked)."""
    for name in changes:
        if name not in _FIELDS:
            raise TypeError(f"QuantizedTensor has no field {name!r}")
    fields = {
        "codes": q.codes,
        "scale": q.scale,
        "global_scale": q.global_scale,
        "scheme": scheme_of(q),
        "shape": tuple(q.shape),
        "hp_dtype": q.hp_dtype,
        "scale_layout": q.scale_layout,
        "linear": linear_of(q),
    }
    fields.update(changes)
    return QuantizedTensor(**fields)


def _build(cls, codes, scale, global_scale, scheme, shape, hp_dtype, scale_layout, linear):
    """The wrapper of fields already checked (`_check_fields`)."""
    self = torch.Tensor._make_wrapper_subclass(
        cls,
        shape,
        strides=_logical_strides(codes, scheme, shape),
        dtype=hp_dtype,
        device=codes.device,
        requires_grad=False,
    )
    for name, value in (
        ("codes", codes),
        ("scale", scale),
        ("global_scale", global_scale),
        ("_scheme_key", _key(scheme)),
        ("hp_dtype", hp_dtype),
        ("scale_layout", scale_layout),
        ("_linear_key", None if linear is None else _key(linear)),
    ):
        object.__setattr__(self, name, value)
    return self


def view_of(q: QuantizedTensor, codes, scale, scheme, shape: tuple) -> QuantizedTensor:
    """q's view with `codes`, `scale`, `scheme` and `shape`, whose fields are not checked
    again: for a shape op that derives all four from q's own, consistently (`_tensor_ops.
    permute`), where `replace`'s checks, at every call of a training layer, would only
    confirm what the op's rule already guarantees. Traced by Dynamo (a compiled layer's
    backward), it goes through the constructor, which Dynamo traces, and
    `_make_wrapper_subclass` called bare it cannot."""
    if _storage.traced(codes):
        return replace(q, codes=codes, scale=scale, scheme=scheme, shape=shape)
    return _build(
        QuantizedTensor,
        codes,
        scale,
        q.global_scale,
        scheme,
        shape,
        q.hp_dtype,
        q.scale_layout,
        linear_of(q),
    )


def with_scale_layout(q: QuantizedTensor, layout: str) -> QuantizedTensor:
    """q with its scales in `layout` ("plain" or "cublas_blocked")."""
    if layout == q.scale_layout:
        return q
    shape, scheme = tuple(q.shape), scheme_of(q)
    extend.stored_scale_shape(scheme, shape, layout)  # validates the layout
    rows, cols = extend.blocked_matrix_shape(scheme, shape)
    scale_bytes = _storage.as_bytes(q.scale)
    if layout == "cublas_blocked":
        new_bytes = _layouts.to_cublas_blocked(scale_bytes.reshape(rows, cols))
    else:
        new_bytes = _layouts.from_cublas_blocked(scale_bytes, rows, cols).reshape(
            scheme.scale_shape(shape)
        )
    return replace(q, scale=_storage.as_stored(new_bytes, q.scale.dtype), scale_layout=layout)


def _key(obj) -> tuple:
    """A scheme or LinearConfig as a tuple of literals: its kind, then its fields in order."""
    values = []
    for name in _FIELD_NAMES[type(obj)]:
        value = getattr(obj, name)
        values.append(_key(value) if type(value) in _FIELD_NAMES else value)
    return (type(obj).__name__, *values)


def _decode(key: tuple):
    """Inverse of `_key`; cached in eager mode (a dataclass build checks its fields)."""
    compiling = torch.compiler.is_compiling()
    if not compiling and key in _DECODED:
        return _DECODED[key]
    kind, *values = key
    if kind == "LinearConfig":
        activation = values[0]
        obj = _config.LinearConfig(None if activation is None else _decode(activation), *values[1:])
    else:
        obj = _SCHEME_KINDS[kind](*values)
    if not compiling:
        _DECODED[key] = obj
    return obj


def _keep_aliasing(func, args, kwargs, out):
    """View ops: tell torch the result aliases the input, unless it was dequantized
    (a fresh plain tensor, which aliases nothing)."""
    quantized = isinstance(out, QuantizedTensor) or (
        isinstance(out, (list, tuple)) and all(isinstance(o, QuantizedTensor) for o in out)
    )
    return return_and_correct_aliasing(func, args, kwargs, out) if quantized else out


def _is_size(n) -> bool:
    return isinstance(n, torch.SymInt) or (
        isinstance(n, int) and not isinstance(n, bool) and n >= 0
    )


def _check_fields(codes, scale, global_scale, scheme, shape, hp_dtype, scale_layout, linear):
    """The logical shape as a tuple, after checking every field against the others."""
    extend.check_scheme(scheme)
    if not isinstance(shape, (tuple, list, torch.Size)) or not all(_is_size(n) for n in shape):
        raise ValueError(
            f"QuantizedTensor.shape must be a tuple of non-negative ints, got {shape!r}"
        )
    shape = tuple(shape)
    scheme.check_shape(shape)
    if hp_dtype not in _storage.HP_DTYPES:
        raise ValueError(
            f"QuantizedTensor.hp_dtype must be one of {tuple(_storage.HP_DTYPES)}, got {hp_dtype!r}"
        )
    _expect_tensor(
        "codes", codes, _storage.CODE_DTYPES[scheme.fmt], extend.codes_shape(scheme, shape)
    )
    _expect_tensor(
        "scale",
        scale,
        _storage.SCALE_DTYPES[extend.scale_format(scheme)],
        extend.stored_scale_shape(scheme, shape, scale_layout),
    )
    if scheme.family == "nvfp4" and scheme.global_scale:
        _expect_tensor("global_scale", global_scale, torch.float32, ())
    elif global_scale is not None:
        raise ValueError(f"QuantizedTensor.global_scale must be None for {scheme}")
    for field, tensor in (("scale", scale), ("global_scale", global_scale)):
        if tensor is not None and tensor.device != codes.device:
            raise ValueError(
                f"QuantizedTensor.{field} is on {tensor.device}, the codes on {codes.device}; "
                "all parts must share one device"
            )
    if linear is not None and not isinstance(linear, _config.LinearConfig):
        raise TypeError(f"QuantizedTensor.linear must be a LinearConfig or None, got {linear!r}")
    return shape


def _expect_tensor(field, value, dtype, shape) -> None:
    if not isinstance(value, torch.Tensor) or isinstance(value, QuantizedTensor):
        raise TypeError(
            f"QuantizedTensor.{field} must be a torch.Tensor, got {type(value).__name__}"
        )
    if value.dtype != dtype:
        raise TypeError(f"QuantizedTensor.{field} must be {dtype}, got {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"QuantizedTensor.{field} must have shape {tuple(shape)}, got {tuple(value.shape)}"
        )


def _logical_strides(codes: torch.Tensor, scheme, shape: tuple) -> tuple:
    """Strides of the logical tensor: the codes' (a transposed weight reports itself
    non-contiguous), with packed fp4 counted one element a nibble."""
    if scheme.fmt != "float4_e2m1fn":
        return tuple(codes.stride())
    if codes.dim() and codes.stride(-1) == 1:
        return tuple(2 * s for s in codes.stride()[:-1]) + (1,)
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
