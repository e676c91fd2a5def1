"""Which tensors of a checkpoint the inference presets quantize: the weights of linear
layers. `quantize_` quantizes `nn.Linear` weights; a checkpoint has names and arrays
only, so the applications that work on files (`lowp inspect`, `lowp convert`, the
shard-by-shard conversion) recognise those weights by one rule: rank 2, named `*weight`,
not an embedding table.
"""

import numpy as np


def not_a_linear_weight(name: str, x: np.ndarray) -> str | None:
    """Why the presets would not quantize this tensor, or None if they would: they
    quantize the weights of linear layers, rank 2 and named `*weight`; an embedding
    table (`embed` in its name) is looked up, not multiplied."""
    if x.ndim != 2:
        return f"rank {x.ndim}: not a linear layer's weight (biases, norms and scalars stay high precision)"
    if not name.endswith("weight"):
        return "not named *weight: not a linear layer's weight"
    if "embed" in name.lower():
        return "an embedding table, not a linear layer's weight"
    return None


def is_float(x) -> bool:
    """A floating-point array lowp quantizes: float32, bfloat16 or float16 (float64 would
    round twice on its way to float32, spec §0.1)."""
    return isinstance(x, np.ndarray) and x.dtype.name in ("float32", "bfloat16", "float16")
