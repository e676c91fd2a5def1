"""Another tool's checkpoint tensor dequantized as its producer does, in PyTorch.

The core gives the producer's rule as a plan (`lowp.extend.producer_plan`: a code-value
table, a per-group float32 multiplier, two dtypes); this runs it on torch tensors, on any
device, bit for bit as the NumPy reference and the producer.
"""

import torch

import lowp
from lowp import extend
from lowp_torch import _groups, _layouts

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dequantize_checkpoint(
    q: lowp.QTensor, out_dtype: torch.dtype | None = None, device=None
) -> torch.Tensor:
    """The producer's dequantization of `q` (a QTensor `lowp.load` read from another
    tool's checkpoint), as a torch tensor on `device`.

    Args:
      q: a lowp.QTensor whose `origin` is set.
      out_dtype: torch.float32, bfloat16 or float16; None for the producer's own.
      device: where to compute; default CPU.

    >>> # q = lowp.load("ckpt/")["model.layers.0.mlp.down_proj.weight"]
    >>> # w = lowp_torch.dequantize_checkpoint(q, device="cuda")
    """
    names = {v: k for k, v in _TORCH_DTYPES.items()}
    if out_dtype is not None and out_dtype not in names:
        raise ValueError(
            f"out_dtype must be one of {tuple(_TORCH_DTYPES.values())} or None, got {out_dtype!r}"
        )
    plan = extend.producer_plan(q, None if out_dtype is None else names[out_dtype])
    codes = torch.from_numpy(q.codes).to(device)
    if q.scheme.fmt == "float4_e2m1fn":
        codes = _layouts.unpack_fp4(codes)
    table = torch.from_numpy(plan.table).to(device)
    multiplier = _groups.expand(torch.from_numpy(plan.multiplier).to(device), q.scheme, q.shape)
    product = table[codes.long()] * multiplier  # float32 * float32: one float32 rounding
    return product.to(_TORCH_DTYPES[plan.mid_dtype]).to(_TORCH_DTYPES[plan.out_dtype])
