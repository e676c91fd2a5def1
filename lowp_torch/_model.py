"""`quantize_(model, config)`: quantize every nn.Linear weight in place, for inference
(training is `convert_to_training`'s); `to_inference`: from training back to that
inference form; `save_quantized` / `load_quantized`: the model's state through
lowp's interchange file.
"""

import dataclasses

import ml_dtypes
import numpy as np
import torch
from torch import nn

import lowp
from lowp_torch import _config, _convert, _log, _qtensor, _quantize, _training_linear

# torch dtypes lowp.save stores that numpy has only through ml_dtypes: (numpy dtype,
# same-width int dtype used to move the bytes between torch and numpy).
_BYTES_VIEWS = {
    torch.bfloat16: (np.dtype(ml_dtypes.bfloat16), torch.int16),
    torch.float8_e4m3fn: (np.dtype(ml_dtypes.float8_e4m3fn), torch.uint8),
    torch.float8_e5m2: (np.dtype(ml_dtypes.float8_e5m2), torch.uint8),
    torch.float8_e8m0fnu: (np.dtype(ml_dtypes.float8_e8m0fnu), torch.uint8),
}


def quantize_(
    model: nn.Module,
    config: "lowp.InferenceConfig | str",
    filter_fn=None,
    *,
    pad_to_16: bool = False,
    kernel: str = "auto",
    fast_accum: bool = True,
    strict: bool = False,
) -> nn.Module:
    """Replace each `nn.Linear` weight of `model` with a QuantizedTensor, in place, for
    inference.

    `quantize_` is inference only; training goes through `convert_to_training(model,
    recipe)`, and a `lowp.Recipe` given here is refused with a TypeError saying so (a
    string always names an inference preset, even where a recipe has the same name, as
    "float8_rowwise" and "mxfp8" do).

    The weight is stored (out_features, in_features) and quantized with
    `config.weight`, scaled along in_features where the scheme has an axis (spec §8,
    §9). When `config.activation` is set, each call quantizes the input with it
    (dynamically: fresh scales per call) and runs the GEMM through `scaled_matmul`;
    otherwise the weight is dequantized to the input's dtype (weight-only). Biases,
    other parameters and buffers are untouched. The quantized weights have no
    gradient: this is inference.

    Args:
      model: any module; its nn.Linear submodules (shared ones once) are converted.
      config: a `lowp.InferenceConfig`, or a preset name from
        `lowp.InferenceConfig.names()` ("float8_rowwise", "mxfp8", "nvfp4", ...).
      filter_fn: `filter_fn(module, name) -> bool`; only linears it accepts are
        quantized (skip, say, an lm_head whose in_features no MX block divides).
      pad_to_16, kernel, fast_accum, strict: the weight's `LinearConfig` (see there).
        With an explicit fp8 kernel and no padding, a layer whose K or N is not a
        multiple of 16 is refused here, naming it.

    Returns:
      `model`, for chaining.

    Raises:
      TypeError: `config` is not an inference config (a `lowp.Recipe` names
        `convert_to_training`).
      ValueError: naming the layer, for a weight the scheme cannot quantize (a block
        that does not divide in_features, an odd in_features for fp4, ...), or whose
        shape an explicitly requested fp8 kernel cannot take. Nothing is skipped
        silently: exclude such layers with `filter_fn`.

    >>> import torch, lowp_torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    >>> _ = lowp_torch.quantize_(model, "float8_rowwise")
    >>> type(model[0].weight).__name__, model(torch.zeros(2, 64)).shape
    ('QuantizedTensor', torch.Size([2, 32]))
    """
    config = _inference_config(config)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable(module, name) -> bool, got {filter_fn!r}")
    called_inside = _linears_called_inside_attention(model)
    quantized, seen = [], set()
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or id(module) in seen:
            continue
        seen.add(id(module))
        if filter_fn is not None and not filter_fn(module, name):
            continue
        _refuse_training_layer(module, name, "quantize_")
        if id(module) in called_inside and config.weight.fmt == "float4_e2m1fn":
            raise ValueError(
                f"quantize_: layer {name!r} is an nn.MultiheadAttention's out_proj, whose "
                "weight F.multi_head_attention_forward uses transposed (aten.t + addmm), "
                "which packed fp4 codes cannot be without dequantizing: its input would "
                "not be quantized. Leave it out with filter_fn, or use a float8 or mxfp8 "
                "preset for it"
            )
        weight_name = f"{name}.weight" if name else "weight"
        linear = _config.LinearConfig(
            activation=config.activation,
            kernel=kernel,
            fast_accum=fast_accum,
            pad_to_16=pad_to_16,
            strict=strict,
            name=weight_name,
        )
        quantized.append((module, _quantize_weight(module, config, linear)))
    # Assigned only once every layer has quantized: an error leaves the model as it was.
    for module, weight in quantized:
        module.weight = nn.Parameter(weight, requires_grad=False)
    return model


def _linears_called_inside_attention(model: nn.Module) -> set[int]:
    """ids of the nn.Linear layers an nn.MultiheadAttention reaches through
    F.multi_head_attention_forward, not by calling them: its out_proj."""
    return {id(m.out_proj) for m in model.modules() if isinstance(m, nn.MultiheadAttention)}


def _refuse_training_layer(module: nn.Module, name: str, caller: str) -> None:
    """A lowp_torch.Linear (an nn.Linear too) runs its recipe on a float weight: an
    inference weight put into it would fail at its first call, naming neither."""
    if isinstance(module, _training_linear.Linear):
        raise TypeError(
            f"{caller}: layer {name or '(the model)'!r} is a lowp_torch.Linear converted for "
            "training; turn the model into its inference form with lowp_torch.to_inference "
            "(which quantizes it) first"
        )


def _quantize_weight(module: nn.Linear, config, linear) -> _qtensor.QuantizedTensor:
    weight, name = module.weight, linear.name
    where = f"quantize_: layer {name!r} (in_features={module.in_features}, out_features={module.out_features})"
    if isinstance(weight, _qtensor.QuantizedTensor):
        raise TypeError(f"{where} is already quantized")
    if linear.kernel in ("scaled_mm", "fbgemm") and not linear.pad_to_16:
        for dim, size in (
            ("in_features", module.in_features),
            ("out_features", module.out_features),
        ):
            if size % 16:
                raise ValueError(
                    f"{where}: {dim}={size} is not a multiple of 16, which kernel="
                    f"{linear.kernel!r} needs; pass pad_to_16=True (zero-pads, exact), "
                    "kernel='auto' (emulates such layers), or skip it with filter_fn"
                )
    try:
        if config.activation is not None:  # the inputs' (M, K) shape must suit it too
            config.activation.check_shape((1, module.in_features))
        q = _quantize.quantize(weight.detach(), config.weight, name=name)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where}: {e}. Skip the layer with filter_fn.") from e
    return _qtensor.replace(q, linear=linear)


def memory_footprint(model: nn.Module) -> int:
    """Bytes of `model`'s parameters and buffers as stored: a QuantizedTensor counts its
    codes and scales (`QuantizedTensor.nbytes`), a plain tensor numel * element_size.

    transformers' `get_memory_footprint()` multiplies each parameter's numel by its
    dtype's size, and a quantized weight's dtype is the float one it stands for, so it
    reports the float model's size. Shared tensors count once. Not counted: the float
    copies CPU inference keeps of quantized weights (`weight_cache`).

    >>> import torch, lowp_torch
    >>> model = torch.nn.Linear(64, 32, bias=False)
    >>> memory_footprint(lowp_torch.quantize_(model, "float8_rowwise"))  # codes + row scales
    2176
    """
    seen, total = set(), 0
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, _qtensor.QuantizedTensor):
            total += t.nbytes
        else:
            total += t.numel() * t.element_size()
    return total


def save_quantized(model: nn.Module, path) -> None:
    """Write `model.state_dict()` to a lowp interchange file (spec §9) with `lowp.save`.

    Quantized weights become QTensors under their parameter names ("fc1.weight"), each
    with the activation scheme its layer quantizes inputs with (`LinearConfig.activation`;
    None, weight-only, for a weight without a LinearConfig), so `load_quantized` needs no
    config. Every other parameter and persistent buffer is a plain array of its dtype
    (bfloat16 included). The file loads in `lowp`, `lowp_jax` and `load_quantized`.
    """
    tensors, activations = {}, {}
    for name, t in model.state_dict().items():
        if isinstance(t, _qtensor.QuantizedTensor):
            tensors[name] = _convert.to_lowp(t)
            linear = _qtensor.linear_of(t)
            activations[name] = None if linear is None else linear.activation
        else:
            tensors[name] = _to_numpy(t)
    lowp.save(path, tensors, activations=activations)


def load_quantized(
    model: nn.Module,
    path,
    config: "lowp.InferenceConfig | str | None" = None,
    *,
    pad_to_16: bool = False,
    kernel: str = "auto",
    fast_accum: bool = True,
    strict: bool = False,
) -> nn.Module:
    """Load a file from `save_quantized` into `model` (float or already quantized), in place.

    Each QTensor entry must name an nn.Linear weight; it replaces that weight with the
    stored codes and scales, bytes unchanged, so its dequantized values are the saved
    ones bit for bit. A checkpoint directory of another tool (`lowp.load` reads it) loads
    the same way: its codes and scales run with lowp's own arithmetic, not the producer's
    dequantization rule (`QTensor.origin`), whose values may differ in the last bit
    (`lowp_torch.dequantize_checkpoint` gives those). Plain arrays are copied into the parameters and buffers of the
    same name (dtype and shape must match). The file and the model must hold the same
    names.

    Each layer's activation scheme (how its input is quantized at each call) is the
    file's, where the file records one (`lowp.load_activations`); `config`, or a model
    already quantized with `quantize_`, must then agree with it. Where the file records
    none (a file written before lowp_format 2, or by `lowp.save` without
    `activations=`) it comes from `config` (whose weight scheme must match the file's),
    else from the weight already in place; else the layer is weight-only, and a
    WARNING on the "lowp_torch" logger names those layers.

    Returns:
      `model`.

    Raises:
      ValueError: naming the layer, for names, shapes or dtypes that differ between the
        file and the model, a weight scheme other than `config.weight`, or an activation
        scheme the file records that differs from `config.activation` or from the one
        the model's layer already has (both schemes named). The model is left as it was.

    >>> import os, tempfile, torch, lowp_torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> lowp_torch.save_quantized(lowp_torch.quantize_(torch.nn.Linear(64, 8), "mxfp8"), path)
    >>> lowp_torch.load_quantized(torch.nn.Linear(64, 8), path).weight.linear.activation
    MXScaling(fmt='float8_e4m3fn', block=32, mode='rceil', axis=-1)
    """
    config = None if config is None else _inference_config(config)
    stored, recorded = lowp.load(path), lowp.load_activations(path)
    state = model.state_dict(keep_vars=True)
    missing, unexpected = sorted(set(state) - set(stored)), sorted(set(stored) - set(state))
    if missing or unexpected:
        raise ValueError(
            f"load_quantized: {path}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    modules = dict(model.named_modules())
    # Checked and converted first, assigned after: an error leaves the model as it was.
    weights, copies, weight_only = [], [], []
    for name, value in stored.items():
        target = state[name]
        if isinstance(value, lowp.QTensor):
            module_name, _, attr = name.rpartition(".")
            module = modules.get(module_name)
            if not isinstance(module, nn.Linear) or attr != "weight":
                raise ValueError(
                    f"load_quantized: {path}: QTensor {name!r} is not an nn.Linear weight"
                )
            _refuse_training_layer(module, module_name, "load_quantized")
            if target.device.type == "meta":
                raise ValueError(
                    f"load_quantized: {name!r} is on the meta device, where nothing can be "
                    "loaded; build the model on a real device (or to_empty it) first"
                )
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"load_quantized: {name!r} has shape {tuple(value.shape)} in the file, "
                    f"{tuple(target.shape)} in the model"
                )
            if config is not None and value.scheme != config.weight:
                raise ValueError(
                    f"load_quantized: {name!r} was saved with {value.scheme}, not {config.weight}"
                )
            activation = _loaded_activation(name, recorded, config, target, path)
            if activation is _UNRECORDED:
                activation = None
                weight_only.append(name)
            if activation is not None:  # a hand-made file may not suit the layer's inputs
                try:
                    activation.check_shape((1, module.in_features))
                except ValueError as e:
                    raise ValueError(
                        f"load_quantized: {name!r}: activation {activation}: {e}"
                    ) from e
            linear = _config.LinearConfig(activation, kernel, fast_accum, pad_to_16, strict, name)
            value = dataclasses.replace(value, origin=None)  # lowp's arithmetic (docstring)
            q = _qtensor.replace(_convert.from_lowp(value, device=target.device), linear=linear)
            weights.append((module, q))
        else:
            if isinstance(target, _qtensor.QuantizedTensor):
                raise TypeError(
                    f"load_quantized: {name!r} is a plain array in {path}, quantized in the model"
                )
            if target.device.type == "meta":
                raise ValueError(
                    f"load_quantized: {name!r} is on the meta device, where nothing can be "
                    "loaded; build the model on a real device (or to_empty it) first"
                )
            t = _from_numpy(value)
            if t.dtype != target.dtype or t.shape != target.shape:
                raise ValueError(
                    f"load_quantized: {name!r} is {t.dtype}{list(t.shape)} in the file, "
                    f"{target.dtype}{list(target.shape)} in the model"
                )
            copies.append((target, t))
    if weight_only:
        _log.logger.warning(
            f"load_quantized: {path} records no activation scheme and no config was given: "
            f"{len(weight_only)} layer(s) run weight-only (inputs not quantized): "
            f"{', '.join(weight_only[:5])}{', ...' if len(weight_only) > 5 else ''}. Pass "
            "config= to quantize their inputs."
        )
    for module, q in weights:
        module.weight = nn.Parameter(q, requires_grad=False)
    with torch.no_grad():
        for target, t in copies:
            target.copy_(t)
    return model


_UNRECORDED = object()


def _loaded_activation(name, recorded: dict, config, target, path):
    """Layer `name`'s activation scheme as `load_quantized` documents it; _UNRECORDED where
    neither the file, `config` nor the model says."""
    linear = _qtensor.linear_of(target) if isinstance(target, _qtensor.QuantizedTensor) else None
    if name not in recorded:
        if config is not None:
            return config.activation
        return _UNRECORDED if linear is None else linear.activation
    in_file = recorded[name]
    if config is not None and config.activation != in_file:
        raise ValueError(
            f"load_quantized: {name!r}: {path} records activation {_describe(in_file)}, "
            f"config.activation is {_describe(config.activation)}"
        )
    if linear is not None and linear.activation != in_file:
        raise ValueError(
            f"load_quantized: {name!r}: {path} records activation {_describe(in_file)}, the "
            f"model's layer quantizes its input with {_describe(linear.activation)}; load into "
            "the float model (the file's scheme is used) or pass the file's config"
        )
    return in_file


def _describe(activation) -> str:
    return "None (weight-only)" if activation is None else str(activation)


def to_inference(
    model: nn.Module,
    config: "lowp.InferenceConfig | str",
    filter_fn=None,
    *,
    pad_to_16: bool = False,
    kernel: str = "auto",
    fast_accum: bool = True,
    strict: bool = False,
) -> nn.Module:
    """Turn a model converted for training back into `quantize_`'s inference form, in place.

    Each `lowp_torch.Linear` becomes a plain nn.Linear holding the same (trained)
    weight and bias, and its weight is then quantized by `quantize_` with `config`: the
    bytes a fresh `quantize_` of the float model gives. Layers that were not converted
    for training (left out by convert_to_training's filter_fn) stay as they are.

    Args:
      model: a model from `convert_to_training`.
      config: a `lowp.InferenceConfig` or an inference preset name.
      filter_fn, pad_to_16, kernel, fast_accum, strict: as for `quantize_`, applied to
        the converted layers (one filter_fn rejects becomes a high-precision nn.Linear).

    Returns:
      `model`; if `model` itself is a lowp_torch.Linear, the new quantized nn.Linear.
      On an error (a layer `config` cannot quantize, named) the model is left as it was.

    >>> import torch, lowp_torch
    >>> model = lowp_torch.convert_to_training(torch.nn.Sequential(torch.nn.Linear(64, 32)), "mxfp8")
    >>> model = lowp_torch.to_inference(model, "mxfp8")
    >>> type(model[0]).__name__, type(model[0].weight).__name__
    ('Linear', 'QuantizedTensor')
    """
    config = _inference_config(config)
    plain, trained = {}, {}  # id(lowp_torch.Linear) -> the nn.Linear replacing it, and back
    for module in model.modules():
        if isinstance(module, _training_linear.Linear):
            linear = _plain_linear(module)
            plain[id(module)], trained[id(linear)] = linear, module

    def chosen(module, name):
        return id(module) in trained and (filter_fn is None or filter_fn(module, name))

    kwargs = {"pad_to_16": pad_to_16, "kernel": kernel, "fast_accum": fast_accum, "strict": strict}
    if isinstance(model, _training_linear.Linear):
        return quantize_(plain[id(model)], config, chosen, **kwargs)
    _training_linear.swap_children(model, plain)
    try:
        return quantize_(model, config, chosen, **kwargs)
    except (TypeError, ValueError):
        _training_linear.swap_children(model, trained)  # quantize_ changed nothing: undo the swap
        raise


def _plain_linear(layer) -> nn.Linear:
    """An nn.Linear holding `layer`'s Parameters (no copy)."""
    with torch.device("meta"):
        linear = nn.Linear(layer.in_features, layer.out_features, bias=False)
    linear.weight, linear.bias = layer.weight, layer.bias
    return linear


def _inference_config(config) -> "lowp.InferenceConfig":
    if isinstance(config, str):
        return lowp.InferenceConfig.from_name(config)
    if isinstance(config, lowp.Recipe):
        raise TypeError(
            f"quantize_ and to_inference take an inference config (lowp.InferenceConfig or a "
            f"preset name), got the training recipe {config.name!r}: to train, use "
            f"lowp_torch.convert_to_training(model, {config.name!r}); to serve, "
            f"lowp.InferenceConfig.from_name(...) with a preset of {lowp.InferenceConfig.names()}"
        )
    if not isinstance(config, lowp.InferenceConfig):
        raise TypeError(f"expected a lowp.InferenceConfig or a preset name, got {config!r}")
    return config


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype in _BYTES_VIEWS:
        np_dtype, int_dtype = _BYTES_VIEWS[t.dtype]
        return t.view(int_dtype).numpy().view(np_dtype).copy()
    return t.numpy().copy()


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    for torch_dtype, (np_dtype, int_dtype) in _BYTES_VIEWS.items():
        if a.dtype == np_dtype:
            ints = np.ascontiguousarray(a).view(np.int16 if int_dtype == torch.int16 else np.uint8)
            return torch.from_numpy(ints.copy()).view(torch_dtype)
    return torch.from_numpy(np.array(a, copy=True))
