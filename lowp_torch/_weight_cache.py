"""The float copy of a quantized weight that CPU inference reuses between calls.

A `quantize_`'d layer with no fast kernel (every layer on a CPU) multiplies by its
weight's dequantization: `dequantize(w)` in the weight-only branch of `_linear` and in
the emulated GEMM. The weight is constant in inference, so on the CPU, in eager mode,
`dequantized(w, out_dtype)` keeps that tensor on `w` and hands it back on the next call:
the same values (dequantize is a pure function of the codes and scales), without the
per-call passes over the weight that made a quantized BERT several times slower than
the float one (docs/performance.md, CPU inference).

What it costs: the copy's memory, out_dtype's size per element beside the codes (for a
float32 model, the float weight again, beside its quantized form). `weight_cache(False)`
turns it off inside a `with` block, for a model that must stay small; so does anything
off the CPU or under torch.compile, where the copy is never made.

When it is thrown away: a copy is keyed by the version counters of the weight's codes
and scales, so an in-place change (`load_state_dict`, `copy_`) makes the next call
dequantize again; a tensor made under `torch.inference_mode()` has no version counter
and is never cached. A change made through `.data` (`w.codes.data[...] = ...`) bypasses
the version counters, as it bypasses autograd: it is not seen; change a quantized
weight with `copy_` or `load_state_dict`, or run such code inside `weight_cache(False)`.

The switch is a context variable: a `with weight_cache(...)` block holds in its own
thread (and task) only, and blocks may nest.
"""

import contextlib
import contextvars

import torch

from lowp_torch import _qtensor, _quantize, _storage

_ENABLED = contextvars.ContextVar("lowp_torch.weight_cache", default=True)


@contextlib.contextmanager
def weight_cache(enabled: bool):
    """Inside the block, CPU inference keeps (True) or does not keep (False) each
    quantized weight's dequantization between calls; the default is True.

    >>> import torch, lowp_torch
    >>> model = lowp_torch.quantize_(torch.nn.Linear(64, 32), "float8_weight_only")
    >>> with lowp_torch.weight_cache(False):
    ...     y = model(torch.ones(2, 64))  # dequantizes the weight, keeps nothing
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"weight_cache takes True or False, got {enabled!r}")
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def dequantized(w: _qtensor.QuantizedTensor, out_dtype: torch.dtype) -> torch.Tensor:
    """`dequantize(w, out_dtype)`, kept on `w` between calls where that is safe (above).

    Only a layer weight `quantize_` made (one with a `LinearConfig`) is kept: operands
    quantized afresh each step (training's) would only hold the copy alive longer.
    """
    parts = [w.codes, w.scale] + ([] if w.global_scale is None else [w.global_scale])
    if (
        _storage.traced(w)  # first: torch.compile cannot trace the ContextVar
        or not _ENABLED.get()
        or w.device.type != "cpu"
        or _qtensor.linear_of(w) is None
        or any(t.is_inference() for t in (w, *parts))
    ):
        return _quantize.dequantize(w, out_dtype)
    # Made inside inference_mode, the copy could not be saved for a later backward.
    # w's own counter moves on `w.copy_` (whose inner copies run below the dispatch
    # key that counts versions), the parts' on an in-place change made to them directly.
    key = (out_dtype, torch.is_inference_mode_enabled(), w._version, *(t._version for t in parts))
    kept = w.__dict__.get("_lowp_dequantized")
    if kept is not None and kept[0] == key:
        return kept[1]
    values = _quantize.dequantize(w, out_dtype)
    w.__dict__["_lowp_dequantized"] = (key, values)
    return values
