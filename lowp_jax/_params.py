"""Trained flax parameters to quantized ones, and through lowp's interchange file.

A parameter tree is an nnx `State` (`nnx.state(model)`, `nnx.split(model)[1]`) or a
linen variables/params dict. Its Dense/Linear kernels are the leaves named `kernel`
of rank 2, (in, out) as flax stores them. Quantized, each becomes a QArray of the
config's weight scheme holding the (out, in) = (N, K) transpose, quantized along K
(spec §8, §9): the layout the fp8 GEMM reads and the one every lowp frontend writes.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import lowp
from lowp_jax import _qarray, _quantize, _quantized_dot


def quantize_params(params, config, filter_fn=None):
    """A copy of `params` whose Dense/Linear kernels are QArrays, for inference.

    Args:
      params: an nnx State or a linen params dict (with or without the 'params' level).
      config: a `lowp.InferenceConfig` or a preset name (`lowp.InferenceConfig.names()`).
      filter_fn: `filter_fn(path, kernel) -> bool`, called for each rank-2 `kernel`
        leaf with its path (a tuple of str/int keys) and (in, out) array; only kernels
        it accepts are quantized. Default: all of them.

    Returns:
      The same kind of tree, kernels replaced by QArrays of shape (out, in) quantized
      with `config.weight` (codes and scales bit-identical to `lowp.quantize` of the
      transposed kernel), everything else untouched. Feed it to layers whose dot is a
      `lowp_jax.QuantizedDotGeneral` (`lowp_jax.nnx.Linear`, `lowp_jax.linen.Dense`,
      or `lowp_jax.nnx.quantize_model` for an existing nnx model).

    Raises:
      ValueError: naming the kernel, when the weight scheme cannot quantize it or the
        activation scheme cannot quantize its input (a block that does not divide
        in_features, an odd in_features for fp4). Nothing is skipped silently: leave
        such a kernel out with `filter_fn`.
      TypeError: a kernel that is already a QArray, or a float64 one (spec §0.1: cast
        to float32 first, where rounding twice is what you mean).

    >>> import jax, jax.numpy as jnp, flax.linen as nn, lowp_jax
    >>> params = nn.Dense(8).init(jax.random.key(0), jnp.ones((1, 64)))
    >>> q = lowp_jax.quantize_params(params, "float8_rowwise")
    >>> q["params"]["kernel"].shape, q["params"]["kernel"].codes.dtype
    ((8, 64), dtype(float8_e4m3fn))
    """
    config = _quantized_dot.as_config(config)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable(path, kernel) -> bool, got {filter_fn!r}")
    items, rebuild = _flatten(params)
    values = []
    for path, value in items:
        if is_kernel(path, value) and (filter_fn is None or filter_fn(path, value)):
            value = _quantize_kernel(path, value, config)
        values.append(value)
    return rebuild(values)


def to_inference(trained, config, filter_fn=None, *, impl: str = "auto"):
    """A model or parameter tree trained with a recipe, in the form inference runs.

    Training leaves no state besides the parameters (current scaling keeps no amax
    history), so this is `quantize_params` of the trained high-precision kernels, and for
    an nnx model `lowp_jax.nnx.quantize_model`, which also swaps each quantized layer's
    dot (a `TrainingDotGeneral`, say) for a `QuantizedDotGeneral`.

    Args:
      trained: an nnx State, a linen params dict, or an nnx Module.
      config: a `lowp.InferenceConfig` or a preset name (`lowp.InferenceConfig.names()`).
      filter_fn: `filter_fn(path, kernel) -> bool` choosing the kernels to quantize, as
        for `quantize_params`. Default: all of them.
      impl: the `lowp_jax.dot_general` branch of an nnx model's quantized layers.

    Returns:
      For a tree, what `quantize_params(trained, config, filter_fn)` returns: kernels
      as QArrays (out, in), bit-identical to a fresh `quantize_params`. For an nnx model,
      a converted copy (the trained model is left as it is).

    >>> import jax, jax.numpy as jnp, flax.linen as nn, lowp_jax
    >>> dense = nn.Dense(64, dot_general_cls=lowp_jax.training_dot_general_cls("mxfp8"))
    >>> params = dense.init(jax.random.key(0), jnp.ones((64, 128)))
    >>> lowp_jax.to_inference(params, "mxfp8")["params"]["kernel"].shape
    (64, 128)
    """
    nnx = _nnx()
    if nnx is not None and isinstance(trained, nnx.Module):
        from lowp_jax import nnx as lowp_nnx

        return lowp_nnx.quantize_model(trained, config, filter_fn, impl=impl)
    return quantize_params(trained, config, filter_fn)


def is_kernel(path: tuple, value) -> bool:
    """A Dense/Linear kernel: a rank-2 leaf named `kernel` (a QArray one included)."""
    return bool(path) and path[-1] == "kernel" and len(getattr(value, "shape", ())) == 2


def _quantize_kernel(path, kernel, config) -> _qarray.QArray:
    name = ".".join(map(str, path))
    if isinstance(kernel, _qarray.QArray):
        raise TypeError(f"quantize_params: {name} is already quantized ({kernel.scheme})")
    in_features, out_features = kernel.shape
    where = f"quantize_params: {name} (in_features={in_features}, out_features={out_features})"
    # Before jnp.asarray, which casts a float64 NumPy kernel to float32: twice rounded.
    _quantize.check_input(kernel, f"quantize_params: {name}")
    try:
        if config.activation is not None:  # its inputs (..., in_features) must suit it too
            config.activation.check_shape((1, in_features))
        return _quantize.quantize(jnp.asarray(kernel).T, config.weight, name=name)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{where}: {e}. Leave it in high precision with filter_fn.") from None


def save_quantized(params, path, *, names=None, config=None) -> None:
    """Write a parameter tree to a lowp interchange file (spec §9) with `lowp.save`.

    QArray kernels become QTensors (codes and scales (out, in), bytes unchanged);
    high-precision kernels are written transposed, (out, in), as spec §9 stores linear
    weights; every other leaf is a plain array of its dtype (bfloat16 included).

    A tree does not know how its layers quantize their inputs (that is the module's
    `QuantizedDotGeneral` config): pass `config` to record it, as `lowp_torch`
    records its layers', so that `lowp_torch.load_quantized` needs no config.

    Args:
      params: an nnx State or linen params dict, quantized or not.
      path: the .safetensors file to write (atomically).
      names: `names(path) -> str`, the tensor name of each leaf; default the path's
        keys joined by '.'. For a file another framework reads, use its parameter names
        (a torch model's: `encoder.layer.0.attention.self.query.weight`, say).
      config: the `lowp.InferenceConfig` or preset name the QArray kernels were
        quantized with; its `activation` (None: weight-only) is recorded for each of
        them. Default: nothing recorded.

    Raises:
      ValueError: two leaves with one name, or a QArray kernel whose scheme is not
        `config.weight` (naming it).
    """
    config = None if config is None else _quantized_dot.as_config(config)
    items, _ = _flatten(params)
    tensors, activations = {}, {}
    for leaf_path, value in items:
        name = _name(leaf_path, names)
        if name in tensors:
            raise ValueError(f"save_quantized: two leaves are named {name!r}")
        if isinstance(value, _qarray.QArray):
            tensors[name] = _qarray.to_lowp(value)
            if config is not None:
                what = f"save_quantized: {name!r} was quantized with"
                _check_weight_scheme(what, tensors[name].scheme, config)
                activations[name] = config.activation
        elif is_kernel(leaf_path, value):
            tensors[name] = np.ascontiguousarray(_numpy(value, name).T)
        else:
            tensors[name] = _numpy(value, name)
    lowp.save(path, tensors, activations=activations)


def load_quantized(path, like, *, names=None, config=None):
    """Read a lowp interchange file into a parameter tree shaped like `like`.

    Every leaf of `like` is looked up by name (as `save_quantized` names it). A QTensor
    entry must be a kernel's and becomes a QArray (out, in), its bytes unchanged, so it
    dequantizes to the saved values bit for bit; a plain entry for a kernel is (out, in)
    in the file and is transposed back to flax's (in, out); other plain entries load as
    they are. A checkpoint directory of another tool (`lowp.load` reads it) loads the
    same way: its codes and scales run with lowp's own arithmetic, not the producer's
    dequantization rule (`QTensor.origin`), whose values may differ in the last bit
    (`lowp_jax.dequantize_checkpoint` gives those). A file written by `lowp_torch.save_quantized` (weights (out, in) under
    torch's names) loads into the flax twin with the twin's `names`.

    The tree holds no activation scheme: the module that runs it does
    (`lowp_jax.nnx.quantize_model(model, config)`, `QuantizedDotGeneral(config)`). Pass
    that `config` here to check it against the file; `lowp.load_activations(path)` gives
    what the file records, to build the twin from.

    Args:
      path: the file.
      like: the tree to fill (nnx State or linen params dict), high-precision or
        quantized: it gives names, shapes and dtypes, not values.
      names: as for `save_quantized`.
      config: optional `lowp.InferenceConfig` or preset name the model runs these
        parameters with: each QTensor's scheme must be `config.weight`, and an activation
        scheme the file records must be `config.activation`.

    Returns:
      A tree of the same kind, with the file's values. For nnx, `nnx.update(model, it)`
      puts it into the model.

    Raises:
      ValueError: a leaf the file lacks, a file tensor no leaf takes, a shape or dtype
        that differs from `like`'s, or a scheme that differs from `config`'s, naming
        the tensor (and both schemes).
    """
    config = None if config is None else _quantized_dot.as_config(config)
    if config is not None:  # the header first: a mismatch is found before the tensors load
        for name, activation in lowp.load_activations(path).items():
            if activation != config.activation:
                raise ValueError(
                    f"load_quantized: {name!r}: {path} records activation "
                    f"{_describe(activation)}, config.activation is "
                    f"{_describe(config.activation)}"
                )
    stored = {  # lowp's arithmetic for a checkpoint's tensors (docstring)
        name: dataclasses.replace(v, origin=None) if isinstance(v, lowp.QTensor) else v
        for name, v in lowp.load(path).items()
    }
    if config is not None:
        for name, value in stored.items():
            if isinstance(value, lowp.QTensor):
                what = f"load_quantized: {name!r} is stored in {path} with"
                _check_weight_scheme(what, value.scheme, config)
    items, rebuild = _flatten(like)
    values, used = [], set()
    for leaf_path, ref in items:
        name = _name(leaf_path, names)
        if name not in stored:
            raise ValueError(f"load_quantized: {path} has no tensor {name!r} (for {leaf_path})")
        used.add(name)
        values.append(_loaded_leaf(name, leaf_path, stored[name], ref, path))
    unexpected = sorted(set(stored) - used)
    if unexpected:
        raise ValueError(f"load_quantized: {path} has tensors the tree lacks: {unexpected[:5]}")
    return rebuild(values)


def _check_weight_scheme(what: str, scheme, config) -> None:
    if scheme != config.weight:
        raise ValueError(f"{what} {scheme}, not config.weight = {config.weight}")


def _describe(activation) -> str:
    return "None (weight-only)" if activation is None else str(activation)


def _loaded_leaf(name, leaf_path, value, ref, path):
    kernel = is_kernel(leaf_path, ref)
    # The (out, in) shape the file holds for a kernel, the leaf's own shape otherwise.
    if isinstance(ref, _qarray.QArray):
        file_shape = ref.shape
    else:
        file_shape = tuple(ref.shape)[::-1] if kernel else tuple(ref.shape)
    if isinstance(value, lowp.QTensor):
        if not kernel:
            raise ValueError(f"load_quantized: {path}: QTensor {name!r} is not a rank-2 kernel")
        if tuple(value.shape) != tuple(file_shape):
            raise ValueError(
                f"load_quantized: {name!r} has shape {tuple(value.shape)} in {path}, the tree "
                f"expects (out, in) = {tuple(file_shape)}"
            )
        return _qarray.from_lowp(value)
    if tuple(value.shape) != tuple(file_shape):
        raise ValueError(
            f"load_quantized: {name!r} has shape {tuple(value.shape)} in {path}, the tree "
            f"expects {tuple(file_shape)}{' (out, in)' if kernel else ''}"
        )
    ref_dtype = np.dtype(ref.hp_dtype) if isinstance(ref, _qarray.QArray) else np.dtype(ref.dtype)
    if value.dtype != ref_dtype:
        raise ValueError(
            f"load_quantized: {name!r} is {value.dtype} in {path}, {ref_dtype} in the tree"
        )
    return jnp.asarray(value.T if kernel else value)


def _name(leaf_path: tuple, names) -> str:
    return names(leaf_path) if names is not None else ".".join(map(str, leaf_path))


def _numpy(value, name: str) -> np.ndarray:
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        raise TypeError(f"save_quantized: {name} is {type(value).__name__}, not an array")
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        raise TypeError(
            f"save_quantized: {name} is a PRNG key ({value.dtype}), which a lowp file does "
            "not hold; save the parameters only, e.g. nnx.state(model, nnx.Param)"
        )
    return np.asarray(jax.device_get(value))


def _flatten(params):
    """[(path, leaf)] of a parameter tree (QArrays as leaves; paths as tuples of str and
    int) and a function rebuilding the tree from new leaves in the same order."""
    nnx = _nnx()
    if nnx is not None and isinstance(params, nnx.State):
        flat = list(nnx.to_flat_state(params))
        items = [(tuple(p), _variable_value(v)) for p, v in flat]

        def rebuild(values):
            return nnx.from_flat_state(
                [
                    (p, v.replace(new) if hasattr(v, "replace") else new)
                    for (p, v), new in zip(flat, values, strict=False)
                ]
            )

        return items, rebuild
    leaves, treedef = jax.tree_util.tree_flatten_with_path(
        params, is_leaf=lambda x: isinstance(x, _qarray.QArray)
    )
    items = [(tuple(_key(k) for k in p), leaf) for p, leaf in leaves]
    return items, lambda values: jax.tree_util.tree_unflatten(treedef, values)


def _variable_value(variable):
    """The value an nnx Variable (or VariableState, older flax) holds."""
    if hasattr(variable, "get_value"):
        return variable.get_value()
    return getattr(variable, "value", variable)


def _nnx():
    """flax.nnx, or None where flax is absent (it is optional: then no nnx tree can come)."""
    try:
        from flax import nnx
    except ImportError:
        return None
    return nnx


def _key(k):
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return getattr(k, attr)
    return str(k)
