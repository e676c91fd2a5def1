"""A `lowp_torch.Linear` under DTensor tensor parallelism (`parallelize_module` with
`ColwiseParallel` / `RowwiseParallel`): each rank runs the recipe's GEMMs on its shard.

ColwiseParallel splits the weight's rows, out_features N; RowwiseParallel its columns,
in_features K. The layer quantizes local tensors only, so it runs a recipe only where
every quantization group lies inside a shard, and then each operand has the bytes the
unsharded layer gives it:

  - an operand reduced over the split dim (x and w in the forward under rowwise; dy and
    w.T in the dgrad under colwise) needs blocks along that dim that the shard holds
    whole: MX blocks where the per-rank size is a multiple of the block;
  - an operand split along its other dim needs groups that do not span it: rows,
    blocks; not one tensor-wide scale.

An operand is quantized shard by shard only where it is `plain` (nearest rounding, no
Hadamard transform: stochastic rounding's bits and its data offset are drawn by the
whole tensor's element index) and its scheme keeps no global scale (NVFP4's: the whole
tensor's amax).

Anything else (tensorwise: one amax over the whole tensor; rowwise under either
split: the row or column amax spans shards) is refused naming the layer, the split,
the per-rank size and the group, never run with different bytes. The partial products
are summed across ranks (the rowwise forward, the colwise dgrad) in the output dtype,
so those outputs match the one-device layer to rounding, not bit for bit.
"""

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from lowp import extend
from lowp_torch import _training

_SPLIT = {0: "N", 1: "K"}  # the weight's sharded dim -> the layer dim it splits
_STYLE = {"N": "ColwiseParallel (out_features)", "K": "RowwiseParallel (in_features)"}


def check_split(plan, split: str, size: int, ranks: int, name: str) -> None:
    """ValueError naming the layer unless every quantized operand of `plan` keeps its
    groups inside one shard when the layer dim `split` ("N" or "K") of `size` is split
    over `ranks`."""
    local, rest = divmod(size, ranks)
    where = f"{name}: {_STYLE[split]} splits {split}={size} over {ranks} ranks"
    if rest:
        raise ValueError(f"{where}, not evenly")
    for gemm in (plan.forward, plan.dgrad, plan.wgrad):
        for operand in () if gemm is None else (gemm.a, gemm.b):
            if split not in operand.dims:
                continue
            _check_local(operand, gemm.name, where)
            what = f"the {gemm.name} GEMM's {operand.name}"
            try:
                tile = extend.shard_groups(operand.scheme, operand.dims.index(split), local)
            except ValueError as e:
                raise ValueError(
                    f"{where}: {e}, {what}; {plan.recipe.name} cannot run on this shard "
                    "with the unsharded bytes. Use an MX recipe whose blocks divide the "
                    "per-rank size, or leave the layer out of the plan"
                ) from e
            if tile is None:
                raise ValueError(
                    f"{where}: each group of {operand.scheme} spans the whole dim in {what} "
                    f"(its amax needs every rank's {local}); {plan.recipe.name} cannot run "
                    "on this shard with the unsharded bytes. Use an MX recipe whose blocks "
                    "divide the per-rank size, or leave the layer out of the plan"
                )


def _check_local(operand, gemm: str, where: str) -> None:
    """ValueError unless a shard of `operand` quantizes to its part of the whole
    operand's bytes: nearest rounding, no transform, no global scale."""
    if not operand.plain:
        how = (
            "the random Hadamard transform" if operand.hadamard else f"{operand.rounding} rounding"
        )
        raise ValueError(
            f"{where}: the {gemm} GEMM's {operand.name} uses {how}, whose bits depend on the "
            "whole tensor's element indices; a shard cannot give the unsharded bytes. "
            "Leave the layer out of the plan"
        )
    if getattr(operand.scheme, "global_scale", False):
        raise ValueError(
            f"{where}: the {gemm} GEMM's {operand.name} under {operand.scheme} keeps a global "
            "scale, the whole tensor's amax, which a shard does not hold. Leave the layer "
            "out of the plan"
        )


def forward(layer, x) -> DTensor:
    """`layer`'s output for a weight that is a DTensor sharded as ColwiseParallel or
    RowwiseParallel leaves it: the recipe run on the local shards, returned as the DTensor
    those styles expect (Shard(-1) for colwise; for rowwise the partial products summed, then the bias)."""
    weight, bias, name = layer.weight, layer.bias, layer.lowering.name
    mesh, placements = weight.device_mesh, weight.placements
    if len(placements) != 1 or not isinstance(placements[0], Shard):
        raise ValueError(
            f"{name}: tensor parallel takes a weight Shard(0) or Shard(1) on a 1-D mesh, got {placements}"
        )
    split = _SPLIT[placements[0].dim]
    size = layer.out_features if split == "N" else layer.in_features
    check_split(layer.plan, split, size, mesh.size(), name)
    if layer.recipe.fp32_weight_grad_accumulation:
        raise ValueError(
            f"{name}: fp32_weight_grad_accumulation is not supported under tensor parallel"
        )
    if split == "N":  # x replicated; y sharded along N; dx sums the ranks' partial products
        x_local = x.to_local(grad_placements=[Partial()]) if isinstance(x, DTensor) else x
        b = None if bias is None else bias.to_local()
        y = _training.quantized_linear(x_local, weight.to_local(), b, layer.plan, layer.lowering)
        return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
    x_local = x.to_local(grad_placements=[Shard(x.dim() - 1)]) if isinstance(x, DTensor) else x
    y = _training.quantized_linear(x_local, weight.to_local(), None, layer.plan, layer.lowering)
    y = DTensor.from_local(y, mesh, [Partial()], run_check=False)
    if bias is None:
        return y
    return y.redistribute(mesh, [Replicate()]) + bias  # the bias once, after the sum


def is_sharded(weight: torch.Tensor) -> bool:
    """Whether `weight` is a DTensor (tensor parallelism placed it)."""
    return isinstance(weight, DTensor)
