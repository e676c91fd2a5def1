"""`lowp convert SRC DST --to DIALECT` and the dialect lines of `lowp inspect`.

SRC is a lowp file, a checkpoint directory or a file of a known dialect (anything
`lowp.load` reads); DST a lowp file (`--to lowp`) or a checkpoint directory in one of
`lowp.checkpoints.DIALECTS`. `--quantize SCHEME` also quantizes SRC's float linear
weights on the way (`checkpoint.quantize_linear_weights`, as `quantize_checkpoint`
does shard by shard), with the destination producer's own scale rule where lowp
reproduces one (compressed-tensors, modelopt, hf-fp8: `lowp.checkpoints.quantize_like`),
else with lowp's.

`--to lowp` writes a checkpoint's quantized tensors as their codes and scales with
lowp's own dequantization: a lowp file records no producer rule (`QTensor.origin`),
so values may differ from the producer's in the last bit (docs/checkpoints.md).
"""

import dataclasses
import functools
import json
import os

import numpy as np

import lowp
from lowp.checkpoints import quantize_like
from lowp_apps import checkpoint

LOWP = "lowp"
TARGETS = (LOWP, *lowp.checkpoints.DIALECTS)


def read(path) -> dict:
    """name -> QTensor or numpy array of anything `lowp.load` reads."""
    return lowp.load(path)


def source_config(path) -> dict:
    """SRC's config.json without its quantization_config (the model's architecture),
    to carry into a converted checkpoint; {} for a lone file."""
    config_path = os.path.join(path, "config.json") if os.path.isdir(path) else None
    if config_path is None or not os.path.isfile(config_path):
        return {}

    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    return config


def convert(src, dst, target: str, quantize: "lowp.Scheme | None" = None) -> dict:
    """Write SRC's tensors to DST in `target`; returns what was written (name -> value)."""
    if target not in TARGETS:
        raise ValueError(f"--to {target!r}: expected one of {TARGETS}")
    tensors = read(src)
    if quantize is not None:
        rule = None  # lowp's own
        if target in lowp.checkpoints.PRODUCERS:  # the producer's, to its bytes
            rule = functools.partial(quantize_like, dialect=target)
        tensors, _ = checkpoint.quantize_linear_weights(tensors, quantize, rule)
    if target == LOWP:  # lowp's arithmetic, which a lowp file means (module docstring)
        tensors = {name: _lowp_arithmetic(x) for name, x in tensors.items()}
        lowp.save(dst, tensors)
    else:
        lowp.checkpoints.save_checkpoint(dst, tensors, target, config=source_config(os.fspath(src)))
    return tensors


def _lowp_arithmetic(x):
    """x, a QTensor read from a checkpoint, without its producer's rule (`origin`)."""
    return dataclasses.replace(x, origin=None) if isinstance(x, lowp.QTensor) else x


def requantizes(q: "lowp.QTensor") -> str | bool | None:
    """The producer whose scale rule, run on the dequantized values, gives `q`'s stored
    bytes back (`lowp.checkpoints.PRODUCERS` of its dialect, tried in order); False
    where none does; None where lowp has no rule for the dialect or scheme."""
    origin = q.origin
    if origin is None or origin.dialect not in lowp.checkpoints.PRODUCERS:
        return None
    values = lowp.dequantize(q, q.hp_dtype)
    tried = False
    for producer in lowp.checkpoints.PRODUCERS[origin.dialect]:
        try:
            again = quantize_like(values, q.scheme, origin.dialect, producer)
        except (TypeError, ValueError):
            continue
        tried = True
        same = np.array_equal(again.codes, q.codes) and np.array_equal(again.scale, q.scale)
        same = same and np.array_equal(again.global_scale, q.global_scale)
        if origin.stored_global_scale is not None:
            same = same and np.array_equal(
                again.origin.stored_global_scale, origin.stored_global_scale
            )
        if same:
            return producer
    return False if tried else None


def dialect_lines(tensors: dict) -> list[str]:
    """One line per tensor read from another tool's checkpoint: its dialect, scheme,
    stored names and whether the producer's rule gives its bytes back."""
    lines = []
    for name, q in tensors.items():
        if not isinstance(q, lowp.QTensor) or q.origin is None:
            continue
        producer = requantizes(q)
        back = {False: "no", None: "n/a"}.get(producer, f"yes ({producer})")
        lines.append(
            f"  {name}: {q.origin.dialect}, {q.scheme.spec}, scales {q.origin.scale_dtype}, "
            f"stored as {', '.join(q.origin.names)}; producer rule gives the bytes back: {back}"
        )
    if lines:
        lines.insert(0, f"checkpoint dialect ({len(lines)} tensors):")
    return lines
