"""FSDP2 all-gathers a training layer's weight as codes and scales, not high precision.

`fsdp_quantized_all_gather(model)` makes each `lowp_torch.Linear` weight a `ShardedWeight`
before `torch.distributed.fsdp.fully_shard`. FSDP2 shards it along dim 0 (out_features
N; each rank holds whole rows of K) and, before each forward and backward, asks the
local shard for its all-gather inputs (`fsdp_pre_all_gather`) and turns the gathered
outputs into the unsharded parameter (`fsdp_post_all_gather`). Here the inputs are the
shard's codes and scales in the recipe's schemes, and the unsharded parameter is a
`GatheredWeight`: the quantized operands the layer's GEMMs take of w, with the bytes
`lowp.quantize` gives the full weight.

What is gathered, per phase and per the recipe's plan (`lowp.extend.LinearPlan`):

  before the forward    w (N, K) along K, the forward GEMM's b: row groups lie inside
                        a shard (rowwise scales, MX blocks of K) and are quantized
                        there; tensorwise needs the whole tensor's amax: an
                        all-reduce (MAX) of the shards' amax before the cast
  before the backward   what the dgrad reads of w: the forward's codes again where
                        the plan reuses them (tensorwise); otherwise w along its first
                        axis, N: column scales (rowwise) from an all-reduce of the
                        shards' column amax, MX blocks of 32 rows where no block
                        straddles two shards (else refused, naming the layer)

FSDP2 gathers a layer's weight before its forward and, resharded after it (the
default for all but the root), again before its backward; which one is asked is told
by whether autograd's engine is running, as FSDP2 itself tells them apart. Each gather
moves one orientation's codes, and its scales where each shard has its own: about half
of bf16's bytes per gather, so per step. FSDP2 keeps the buffers of its first gather
for all later ones, so the two phases' inputs have one size: the codes (the same N x K
bytes in both), and a slot the size of the larger phase's row-group scales (rowwise:
the forward's row scales; the backward's column scales are shared, so its slot goes
zeroed: 4 bytes a row). Scales every shard shares travel in the gather's metadata.

An operand the phase did not gather is gathered when the layer asks for it, outside
FSDP2's gathers (`_gather_now`): the forward's, for a forward recomputed in the
backward (activation checkpointing); the dgrad's, where FSDP2 kept the forward's
weight for the backward (reshard_after_forward=False, the root module).

The dgrad takes gathered codes, never a gathered high-precision copy: codes made from
the other orientation's codes would round twice, and a high-precision copy would gather
the bf16 baseline's bytes again. A group's amax is all-reduced as the bits of |x| (int32
MAX), which is the order `lowp.quantize` takes its maximum in, NaN and Inf included.
"""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map_only

from lowp import extend
from lowp_torch import _bits, _qtensor, _quantize, _training_linear

QuantizedTensor = _qtensor.QuantizedTensor
aten = torch.ops.aten

# Ops FSDP2 and optimizers run on a sharded weight whose result is the weight again
# (sharding at init, copies, views); every other op sees the plain tensor inside.
_KEEPS_SUBCLASS = {
    aten.alias.default,
    aten.as_strided.default,
    aten.clone.default,
    aten.detach.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_zeros.default,
    aten.slice.Tensor,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.view.default,
    aten._to_copy.default,
    aten._pin_memory.default,
}


class ShardedWeight(torch.Tensor):
    """A training layer's weight (or FSDP2's shard of it): its values, in `data`, plus
    what `fsdp_pre_all_gather` needs to gather it quantized (the layer's plan and name).
    Every op but FSDP2's hooks sees the plain tensor."""

    data_: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor, plan: extend.LinearPlan, name: str):
        self = torch.Tensor._make_wrapper_subclass(
            cls,
            data.shape,
            strides=data.stride(),
            storage_offset=data.storage_offset(),
            dtype=data.dtype,
            device=data.device,
            requires_grad=data.requires_grad,
        )
        self.data_, self.plan, self.layer_name = data, plan, name
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"ShardedWeight({self.data_!r}, recipe={self.plan.recipe.name!r}, name={self.layer_name!r})"

    def __reduce_ex__(self, protocol):
        # A checkpoint (torch.save, torch.distributed.checkpoint) holds the plain values:
        # the float model's, which loads anywhere without lowp.
        return self.data_.__reduce_ex__(protocol)

    def __tensor_flatten__(self):
        return ["data_"], (self.plan, self.layer_name)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ShardedWeight(inner["data_"], *meta)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        first = next(a for a in tree_leaves((args, kwargs)) if isinstance(a, cls))
        out = func(
            *tree_map_only(cls, lambda t: t.data_, args),
            **tree_map_only(cls, lambda t: t.data_, kwargs or {}),
        )
        if func._schema.is_mutable and isinstance(args[0], cls):  # in place: the weight itself
            return args[0]
        if func not in _KEEPS_SUBCLASS:
            return out
        return tree_map_only(torch.Tensor, lambda t: cls(t, first.plan, first.layer_name), out)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        """The all-gather inputs of one phase (module docstring): the shard's codes, as
        bytes, and its row-group scales in a slot of one size for both phases (FSDP2
        keeps the buffers of the first gather); scales every shard shares travel in
        the metadata."""
        n = outer_size[0]
        group, ranks = mesh.get_group(), mesh.size()
        if n % ranks:
            raise ValueError(
                f"{self.layer_name}: out_features={n} is not a multiple of the {ranks} FSDP ranks; "
                "a quantized all-gather needs even shards (leave the layer out of "
                "fsdp_quantized_all_gather, or pick a mesh that divides it)"
            )
        # FSDP2 gathers before the forward and, resharded after it, again before the
        # backward (also before a forward recomputed there): the autograd engine is then
        # running, which is how FSDP2 itself tells the two apart (`_fsdp_common.is_bw`).
        phase = _BACKWARD if torch._C._current_graph_task_id() != -1 else _FORWARD
        info = _Source(group, ranks, mp_policy.param_dtype)
        local = self.local(info.param_dtype)
        scheme = _phase_scheme(self.plan, phase)
        q = _quantize_shard(local, scheme, group, ranks, self.layer_name)
        inputs = [q.codes.view(torch.uint8)]
        slot = _scale_slot(self.plan, local.shape)
        if slot:
            scale = q.scale.reshape(-1).view(torch.uint8)
            if not _rows_local(scheme, local.shape[0]):  # shared: in the metadata
                scale = scale[:0]
            if scale.numel() < slot:  # the other phase's scales are larger: zeros, sent
                scale = torch.cat([scale, scale.new_zeros(slot - scale.numel())])
            inputs.append(scale)
        shared = None if _rows_local(scheme, local.shape[0]) else q.scale
        metadata = _Gathered(phase, local.dtype, q.codes.dtype, q.scale.dtype, shared, info)
        return tuple(inputs), metadata

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        """The unsharded weight: a GatheredWeight holding the phase's operand, views of
        the gathered codes and scales. A later gather refills those very buffers, in
        either phase, and `out` (the weight made by the first) takes the new operand."""
        operand = _gathered_operand(self.plan, outputs, metadata)
        if out is not None:
            out.refill(metadata.phase, operand, self, metadata.source)
            return None
        n, k = operand.shape
        weight = GatheredWeight((n, k), metadata.hp_dtype, operand.device, self.plan)
        weight.refill(metadata.phase, operand, self, metadata.source)
        return weight, ()

    def local(self, param_dtype) -> torch.Tensor:
        """This rank's rows, in FSDP2's param_dtype where its policy sets one."""
        return self.data_ if param_dtype is None else self.data_.to(param_dtype)


_FORWARD, _BACKWARD = "forward", "backward"


class _Source(NamedTuple):
    """Where a weight's shards are gathered from: FSDP2's group and its mixed precision."""

    group: object
    ranks: int
    param_dtype: torch.dtype | None


class _Gathered(NamedTuple):
    """What `fsdp_post_all_gather` needs beside the gathered bytes."""

    phase: str  # _FORWARD or _BACKWARD
    hp_dtype: torch.dtype
    codes_dtype: torch.dtype
    scale_dtype: torch.dtype
    shared_scale: torch.Tensor | None  # the whole w's scale where every shard holds it
    source: _Source


def _phase_scheme(plan, phase: str):
    """The scheme w is gathered in for `phase`: the forward's b along K; for the
    backward, what the dgrad reads of w (the forward's codes where the plan reuses
    them, else w along its first axis, N)."""
    if phase == _FORWARD:
        return plan.forward.b.scheme
    dgrad = plan.transposed_operand("w")
    return plan.forward.b.scheme if dgrad.reuses_codes else dgrad.along_first_axis


def _rows_local(scheme, rows: int) -> bool:
    """Whether `scheme`'s groups on a shard of `rows` rows of w lie inside it (its scales
    are its part of the whole w's), rather than spanning every shard (one scale for
    all, all-reduced): `lowp.extend.shard_groups`."""
    return extend.shard_groups(scheme, 0, rows) is not None


def _scale_bytes(scheme, shape) -> int:
    itemsize = 4 if scheme.scale_format == "float32" else 1
    return math.prod(scheme.scale_shape(tuple(shape))) * itemsize


def _scale_slot(plan, shard_shape) -> int:
    """Bytes a shard gathers of scales, in either phase: the larger phase's row-group
    scales, or 0 where neither has any (tensorwise: its scale is shared)."""
    return max(
        (
            _scale_bytes(s, shard_shape)
            for s in (_phase_scheme(plan, p) for p in (_FORWARD, _BACKWARD))
            if _rows_local(s, shard_shape[0])
        ),
        default=0,
    )


def _gathered_operand(plan, outputs, metadata) -> QuantizedTensor:
    """The whole w's operand for the phase, from the gathered buffers: codes (N, K);
    row-group scales, each rank's slot cut to its scales, which concatenate along the
    first axis into the whole w's; or the shared scale."""
    scheme = _phase_scheme(plan, metadata.phase)
    codes = outputs[0].view(metadata.codes_dtype)
    n, k = codes.shape
    if metadata.shared_scale is not None:
        scale = metadata.shared_scale
    else:
        ranks = metadata.source.ranks
        used = _scale_bytes(scheme, (n // ranks, k))
        scale = outputs[1].view(ranks, -1)[:, :used]
        scale = scale.reshape(-1).view(metadata.scale_dtype).reshape(scheme.scale_shape((n, k)))
    return QuantizedTensor(codes, scale, None, scheme, (n, k), metadata.hp_dtype)


def _gather_now(shard: "ShardedWeight", phase: str, source: _Source) -> QuantizedTensor:
    """w's operand for `phase`, quantized on every shard and all-gathered here, outside
    FSDP2's gathers: for a forward recomputed in the backward (activation checkpointing)
    and a backward that FSDP2 did not gather for (reshard_after_forward=False)."""
    local = shard.local(source.param_dtype)
    scheme = _phase_scheme(shard.plan, phase)
    q = _quantize_shard(local, scheme, source.group, source.ranks, shard.layer_name)
    n, k = local.shape[0] * source.ranks, local.shape[1]
    codes = _all_gather_rows(q.codes, source)
    scale = _all_gather_rows(q.scale, source) if _rows_local(scheme, local.shape[0]) else q.scale
    return QuantizedTensor(codes, scale, None, scheme, (n, k), local.dtype)


def _all_gather_rows(t: torch.Tensor, source: _Source) -> torch.Tensor:
    """The ranks' `t` concatenated along dim 0, sent as bytes (gloo has no float8)."""
    t = t.contiguous()
    out = torch.empty((source.ranks * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    dist.all_gather_single(out.view(torch.uint8), t.view(torch.uint8), group=source.group)
    return out


def _quantize_shard(local, scheme, group, ranks: int, name: str) -> QuantizedTensor:
    """`local` (rows of w) quantized with `scheme` as the full w would be: rows of codes
    and scales that concatenate, across shards, into `lowp.quantize`'s of w."""
    try:
        rows_local = extend.shard_groups(scheme, 0, local.shape[0]) is not None
    except ValueError as e:
        raise ValueError(
            f"{name}: {e} (out_features / {ranks} ranks); the quantized all-gather would "
            "not give the unsharded bytes. Shard so each rank's out_features holds whole "
            "blocks, or leave the layer out"
        ) from e
    if rows_local:
        return _quantize.quantize(local, scheme, name=name)
    # Groups span every shard's rows (tensorwise; columns): all-reduce each group's amax,
    # as int32 bits of |x|, and quantize the shard with one extra row holding it, which
    # sets each group's amax to the whole tensor's without changing any other code.
    amax_bits = _bits.abs_bits(local.float())
    columns = scheme.tiles(2)[1] is not None  # AxisScaling along N: an amax per column
    amax_bits = amax_bits.amax(dim=0) if columns else amax_bits.amax()
    dist.all_reduce(amax_bits, op=dist.ReduceOp.MAX, group=group)
    amax_row = _bits.from_bits(amax_bits).to(local.dtype).expand(1, local.shape[1])
    q = _quantize.quantize(torch.cat([local, amax_row]), scheme, name=name)
    return QuantizedTensor(
        q.codes[:-1], q.scale, None, scheme, (local.shape[0], local.shape[1]), local.dtype
    )


class GatheredWeight(torch.Tensor):
    """The unsharded weight FSDP2 hands a layer in its forward and backward: w (N, K),
    holding no values, only the operands gathered for the phase: `forward` (w along K,
    the forward's b) before the forward, `dgrad` (w along N, which the dgrad reads
    transposed) before the backward; both at once where the plan reuses the forward's
    codes for the dgrad. An operand the phase did not gather is gathered when asked
    for (`lowp_gathered_operands`, `lowp_dgrad_operand`). Any other use is refused,
    since there are no values to give."""

    @staticmethod
    def __new__(cls, shape, hp_dtype, device, plan, requires_grad=False):
        self = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=hp_dtype, device=device, requires_grad=requires_grad
        )
        self.plan = plan
        self.forward = self.dgrad = self._shard = self._source = None
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"GatheredWeight(shape={tuple(self.shape)}, recipe={self.plan.recipe.name!r})"

    def refill(self, phase: str, operand: QuantizedTensor, shard, source: _Source) -> None:
        """Hold `operand`, gathered for `phase`, into buffers that held the other
        phase's operand before: that one is dropped, never read with these bytes."""
        reuse = self.plan.transposed_operand("w").reuses_codes
        self.forward = operand if phase == _FORWARD or reuse else None
        self.dgrad = operand if phase == _BACKWARD or reuse else None
        self._shard, self._source = shard, source

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        w = args[0]
        whole = func is aten.as_strided.default and tuple(args[1]) == tuple(w.shape)
        if whole or func in (aten.detach.default, aten.alias.default):
            view = cls(w.shape, w.dtype, w.device, w.plan)  # FSDP2 views it at its own shape
            view.forward, view.dgrad, view._shard, view._source = (
                w.forward,
                w.dgrad,
                w._shard,
                w._source,
            )
            return view
        raise TypeError(
            f"{func}: a weight FSDP2 gathered as {w.plan.recipe.name} codes holds no "
            "high-precision values; only lowp_torch.Linear reads it"
        )

    # Run eagerly under torch.compile: they read (and may gather) what FSDP2's hooks
    # left on this weight for the phase, state a graph traced ahead of time would
    # freeze. Dynamo then runs the layer's autograd Function eagerly around them.
    @torch._dynamo.disable
    def lowp_gathered_operands(self, forward_b):
        """(b of the forward, what the dgrad keeps of w: this weight, whose
        `lowp_dgrad_operand` the backward asks), `_training.forward_operands`'s answer."""
        gathered = _phase_scheme(self.plan, _FORWARD)
        if forward_b.scheme != gathered or not forward_b.plain:
            raise ValueError(
                f"gathered codes are {gathered} with nearest rounding and no transform; the "
                f"forward wants {forward_b.scheme} with {forward_b.rounding} rounding"
                + (" and the Hadamard transform" if forward_b.hadamard else "")
            )
        if self.forward is None:  # a forward recomputed in the backward
            self.forward = _gather_now(self._shard, _FORWARD, self._source)
        return self.forward, self

    @torch._dynamo.disable
    def lowp_dgrad_operand(self) -> QuantizedTensor:
        """w along N for the dgrad (`_training.dgrad_operands`): gathered before the
        backward, or here where FSDP2 kept the forward's weight unsharded."""
        if self.dgrad is None:
            self.dgrad = _gather_now(self._shard, _BACKWARD, self._source)
        return self.dgrad


def _check_gatherable(plan, name: str) -> None:
    """ValueError naming layer `name` unless each w operand of `plan` can be made from
    shards quantized alone and gathered: nearest rounding, no Hadamard transform (the
    shards are quantized with neither), no global scale (the whole w's amax), and a
    quantized dgrad whose w.T reuses the forward's codes or is made along w's first axis."""
    dgrad = plan.transposed_operand("w")
    for operand in (plan.forward.b, dgrad):
        if operand is None:
            continue
        if not operand.plain:
            how = (
                "the random Hadamard transform"
                if operand.hadamard
                else f"{operand.rounding} rounding"
            )
            raise ValueError(
                f"{name}: recipe {plan.recipe.name} quantizes {operand.role}'s {operand.name} with "
                f"{how}; a quantized all-gather quantizes each shard with nearest rounding "
                "and no transform"
            )
        if getattr(operand.scheme, "global_scale", False):
            raise ValueError(
                f"{name}: recipe {plan.recipe.name} quantizes {operand.role}'s {operand.name} "
                f"with {operand.scheme}, whose global scale is the whole w's amax; a "
                "quantized all-gather quantizes each shard alone"
            )
    if dgrad is None:
        raise ValueError(
            f"{name}: recipe {plan.recipe.name} needs w in high precision for its dgrad; "
            "a quantized all-gather cannot give it"
        )
    if not dgrad.reuses_codes and dgrad.along_first_axis is None:
        raise ValueError(
            f"{name}: recipe {plan.recipe.name}'s dgrad reads w.T as {dgrad.scheme}, which "
            "cannot be quantized along w's first axis from the gathered shards"
        )


def fsdp_quantized_all_gather(model: nn.Module) -> nn.Module:
    """Make each `lowp_torch.Linear` weight of `model` a `ShardedWeight`, so that
    `fully_shard` all-gathers it as the recipe's codes and scales; call it before
    `fully_shard`. The values, the state_dict keys and an optimizer's view are unchanged.

    Raises ValueError naming the layer for a recipe whose w operands cannot be made from
    gathered codes (stochastic rounding, the Hadamard transform, a global scale,
    high-precision dgrad, fp4 along the first axis) or that accumulates
    weight gradients in `main_grad`, which FSDP2 does not reduce-scatter."""
    for name, module in model.named_modules():
        if not isinstance(module, _training_linear.Linear):
            continue
        plan, weight = module.plan, module.weight
        _check_gatherable(plan, name)
        if plan.recipe.fp32_weight_grad_accumulation:  # main_grad would miss the reduce-scatter
            raise ValueError(
                f"{name}: fp32_weight_grad_accumulation is not supported with FSDP2's "
                "quantized all-gather (use FSDP2's MixedPrecisionPolicy(reduce_dtype=float32))"
            )
        if isinstance(weight, ShardedWeight):
            continue
        module.weight = nn.Parameter(
            ShardedWeight(weight.data, plan, module.lowering.name),
            requires_grad=weight.requires_grad,
        )
    return model
