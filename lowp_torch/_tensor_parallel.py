"""lowp's layers under DTensor tensor parallelism (`parallelize_module` with
`ColwiseParallel` / `RowwiseParallel`): a training `lowp_torch.Linear` runs the recipe's
GEMMs on its shard (`forward`, below); a `quantize_`'d inference layer gets its slice
of the whole weight's codes and scales (`parallelize_quantized`, at the end).

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

import fnmatch

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    parallelize_module,
)

from lowp import extend
from lowp_torch import _qtensor, _tensor_ops, _training

_SPLIT = {0: "N", 1: "K"}  # the weight's sharded dim -> the layer dim it splits
_STYLE = {"N": "ColwiseParallel (out_features)", "K": "RowwiseParallel (in_features)"}
# Styles that only lay out a module's inputs and outputs, leaving its parameters alone.
_KEEPS_PARAMETERS = (PrepareModuleInput, PrepareModuleOutput, PrepareModuleInputOutput)


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
    RowwiseParallel leaves it: the recipe run on the local shards (`sharded_linear`)."""
    name = layer.lowering.name
    split = _SPLIT[_placement(layer.weight, name).dim]
    size = layer.out_features if split == "N" else layer.in_features
    check_split(layer.plan, split, size, layer.weight.device_mesh.size(), name)
    if layer.recipe.fp32_weight_grad_accumulation:
        raise ValueError(
            f"{name}: fp32_weight_grad_accumulation is not supported under tensor parallel"
        )

    def local_linear(x, w, b):
        return _training.quantized_linear(x, w, b, layer.plan, layer.lowering)

    return sharded_linear(x, layer.weight, layer.bias, local_linear, name)


def sharded_linear(x, weight: DTensor, bias, local_linear, name: str) -> DTensor:
    """`local_linear(x, w, b)` run on this rank's shards of a linear layer whose weight
    is a DTensor placed by ColwiseParallel (Shard(0)) or RowwiseParallel (Shard(1)),
    returned as the DTensor those styles expect: Shard(-1) for colwise; for rowwise
    the partial products summed, then the bias added once."""
    mesh, placement = weight.device_mesh, _placement(weight, name)
    if placement.dim == 0:  # x replicated; y sharded along N; dx sums the ranks' partials
        x_local = x.to_local(grad_placements=[Partial()]) if isinstance(x, DTensor) else x
        b = None if bias is None else bias.to_local()
        y = local_linear(x_local, weight.to_local(), b)
        return DTensor.from_local(y, mesh, [Shard(y.dim() - 1)], run_check=False)
    x_local = x.to_local(grad_placements=[Shard(x.dim() - 1)]) if isinstance(x, DTensor) else x
    y = local_linear(x_local, weight.to_local(), None)
    y = DTensor.from_local(y, mesh, [Partial()], run_check=False)
    if bias is None:
        return y
    return y.redistribute(mesh, [Replicate()]) + bias  # the bias once, after the sum


def _placement(weight: DTensor, name: str) -> Shard:
    """The weight's one placement, Shard(0) or Shard(1); ValueError naming the layer
    for any other."""
    placements = weight.placements
    if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim > 1:
        raise ValueError(
            f"{name}: tensor parallel takes a weight Shard(0) or Shard(1) on a 1-D mesh, "
            f"got {placements}"
        )
    return placements[0]


def is_sharded(weight: torch.Tensor) -> bool:
    """Whether `weight` is a DTensor (tensor parallelism placed it)."""
    return isinstance(weight, DTensor)


def parallelize_quantized(model: nn.Module, mesh, plan) -> nn.Module:
    """`parallelize_module(model, mesh, plan)` where some planned layers are `quantize_`'d
    `nn.Linear`s (their weight a QuantizedTensor): each such weight is sharded first,
    each rank keeping its slice of the codes and scales, then the plan is applied.

    Every rank holds the whole quantized model (quantized whole, as on one device), so a
    shard is a slice of its bytes, no communication: ColwiseParallel takes rows of N,
    RowwiseParallel columns of K. Groups inside a shard (rows, whole blocks) are sliced
    with it; a group spanning the split (one tensor scale; a row's scale under a split
    of K) keeps its scale on every rank, as the whole weight's quantization made it. A
    split that cuts a block (`extend.shard_groups`) has no such slice and is refused,
    naming the layer, the per-rank size and the block.

    The input is quantized by each rank as the layer runs: under ColwiseParallel x
    arrives whole, so its bytes are the one-device layer's; under RowwiseParallel each
    rank holds a slice of K, which gives the unsharded bytes only where the activation
    scheme's groups along K lie inside it (MX blocks dividing the per-rank K; weight-only
    layers quantize nothing). A scale over a whole row or the whole tensor (float8
    rowwise, tensorwise), or NVFP4's global scale, would need every rank's amax: refused.

    Each sharded layer becomes a `_ShardedQuantizedLinear` (an nn.Linear whose forward
    runs the layer's quantized `F.linear` on the local shards, `sharded_linear`); the
    other plan entries (plain layers, PrepareModuleInput, ...) go to
    `parallelize_module` unchanged.

    Args:
      model: a module `quantize_` converted, the same on every rank.
      mesh: a 1-D DeviceMesh.
      plan: what `parallelize_module` takes: a ParallelStyle, or a dict from module
        names (fnmatch patterns per dotted atom) to styles.

    Returns:
      `model`, its planned quantized weights DTensors of QuantizedTensor shards.

    Raises:
      ValueError: naming the layer, the split, the per-rank size and the block, for a
        split that is uneven, cuts a weight block, or leaves the input quantization
        without the groups it needs (RowwiseParallel); every layer is checked before
        any is changed.
      TypeError: a quantized linear planned with a style other than ColwiseParallel,
        RowwiseParallel or PrepareModule*, or an nn.Linear subclass with its own forward.

    Usage (every rank):

        lowp_torch.quantize_(model, "mxfp8")
        lowp_torch.parallelize_quantized(
            model, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        )
    """
    entries = plan.items() if isinstance(plan, dict) else [("", plan)]
    shards = {}  # id -> (layer, dim): every layer checked before any is changed
    for pattern, style in entries:
        if isinstance(style, _KEEPS_PARAMETERS):
            continue
        for name, layer in model.named_modules():
            if _matches(pattern, name) and _is_quantized_linear(layer):
                where = name or type(layer).__name__
                shards[id(layer)] = layer, _shard_dim(layer, where, style, mesh)
    for layer, dim in shards.values():
        _shard_weight(layer, dim, mesh)
    return parallelize_module(model, mesh, plan)


def _matches(pattern: str, name: str) -> bool:
    """Whether module `name` is one `parallelize_module`'s plan key `pattern` picks:
    fnmatch atom by atom along the dotted path."""
    if pattern == "" or name == "":
        return pattern == name
    atoms, parts = pattern.split("."), name.split(".")
    return len(atoms) == len(parts) and all(map(fnmatch.fnmatch, parts, atoms))


def _is_quantized_linear(layer: nn.Module) -> bool:
    return isinstance(layer, nn.Linear) and isinstance(layer.weight, _qtensor.QuantizedTensor)


def _shard_dim(layer: nn.Linear, name: str, style, mesh) -> int:
    """The dim of quantized `layer`'s weight that `style` shards over `mesh`;
    ValueError naming the layer where a shard cannot hold the unsharded bytes, or
    quantize the input to them (see `parallelize_quantized`)."""
    if type(layer).forward is not nn.Linear.forward:
        raise TypeError(
            f"{name}: {type(layer).__name__} has its own forward, which tensor parallel "
            "would replace with nn.Linear's on the shards; leave the layer out of the plan"
        )
    if isinstance(style, ColwiseParallel):
        split, dim = "N", 0
    elif isinstance(style, RowwiseParallel):
        split, dim = "K", 1
    else:
        raise TypeError(
            f"{name}: a quantize_'d linear takes ColwiseParallel or RowwiseParallel, "
            f"got {type(style).__name__}"
        )
    if mesh.ndim != 1:
        raise ValueError(f"{name}: tensor parallel takes a 1-D mesh, got {mesh.ndim}-D")
    weight = layer.weight
    ranks, size = mesh.size(), weight.shape[dim]
    local, rest = divmod(size, ranks)
    where = f"{name}: {_STYLE[split]} splits {split}={size} over {ranks} ranks"
    if rest:
        raise ValueError(f"{where}, not evenly")
    scheme = weight.scheme
    try:
        extend.shard_groups(scheme, dim, local)
    except ValueError as e:
        raise ValueError(
            f"{where}: {e}, the weight; a shard cannot hold the unsharded bytes. Split "
            "so that each rank holds whole blocks, or leave the layer out of the plan"
        ) from e
    activation = None if weight.linear is None else weight.linear.activation
    if split == "K" and activation is not None:
        _check_local_input(activation, local, where)
    return dim


def _shard_weight(layer: nn.Linear, dim: int, mesh) -> None:
    """Replace `layer.weight`, a QuantizedTensor, by a DTensor over `mesh` holding this
    rank's slice of its codes and scales along `dim` (`_tensor_ops.slice_`: a scale
    group spanning `dim` stays whole)."""
    weight = layer.weight
    local = weight.shape[dim] // mesh.size()
    start = mesh.get_local_rank() * local
    shard = _tensor_ops.slice_(weight, dim, start, start + local)
    sharded = DTensor.from_local(
        shard, mesh, [Shard(dim)], run_check=False, shape=weight.shape, stride=weight.stride()
    )
    layer.weight = nn.Parameter(sharded, requires_grad=False)
    layer.__class__ = _ShardedQuantizedLinear


class _ShardedQuantizedLinear(nn.Linear):
    """A `quantize_`'d nn.Linear that `parallelize_quantized` sharded. Its forward runs
    `F.linear` on this rank's QuantizedTensor shard, the quantized GEMM of the whole
    layer, its input quantized as `quantize_` set; DTensor's own decomposition of a
    linear (aten.t, then addmm) would transpose the weight, which packed fp4 codes
    cannot be without dequantizing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        linear = weight.to_local().linear
        name = type(self).__name__ if linear is None else linear.name
        return sharded_linear(x, weight, self.bias, torch.nn.functional.linear, name)


def _check_local_input(activation, local: int, where: str) -> None:
    """ValueError unless an (M, local) slice of the input quantizes with `activation` to
    its part of the whole input's bytes."""
    advice = (
        "a rank's slice of x cannot give the unsharded bytes. Use a preset whose "
        "activation blocks divide the per-rank K (mxfp8), weight-only quantization, "
        "ColwiseParallel, or leave the layer out of the plan"
    )
    if getattr(activation, "global_scale", False):
        raise ValueError(
            f"{where}: the input's {activation} keeps a global scale, the whole input's "
            f"amax, which a rank's {local} columns do not hold; {advice}"
        )
    try:
        tile = extend.shard_groups(activation, 1, local)
    except ValueError as e:
        raise ValueError(f"{where}: {e}, the input; {advice}") from e
    if tile is None:
        raise ValueError(
            f"{where}: each group of the input's {activation} spans K (its amax needs every "
            f"rank's {local} columns); {advice}"
        )
