"""FSDP2 all-gathers a training layer's weight as codes and scales, not high precision.

`fsdp_quantized_all_gather(model)` makes each `lowp_torch.Linear` weight a `ShardedWeight`
before `torch.distributed.fsdp.fully_shard`. FSDP2 shards it along dim 0 (out_features
N; each rank holds whole rows of K) and, before each forward and backward, asks the
local shard for its all-gather inputs (`fsdp_pre_all_gather`) and turns the gathered
outputs into the unsharded parameter (`fsdp_post_all_gather`). Here the inputs are the
shard's codes and scales in the recipe's schemes, and the unsharded parameter is a
`GatheredWeight`: the quantized operands the layer's GEMMs take of w, with the bytes
`lowp.quantize` gives the full weight.

What is gathered, per the recipe's plan (`lowp.extend.LinearPlan`):

  forward w (N, K), along K      row groups lie inside a shard: quantized locally
                                 (rowwise scales, MX blocks of K); tensorwise needs
                                 the whole tensor's amax: an all-reduce (MAX) of the
                                 shards' amax before the cast
  dgrad w.T (K, N), along N      tensorwise: the forward's codes, transposed (the plan
                                 reuses them), nothing more is gathered; otherwise w is
                                 quantized along its first axis (N) as well: column
                                 scales (rowwise) from an all-reduce of the shards'
                                 column amax, MX blocks of 32 rows where no block
                                 straddles two shards (else refused, naming the layer)

The dgrad takes gathered codes, never a gathered high-precision copy: codes made from
the other orientation's codes would round twice, and a high-precision copy would gather
more than the bf16 baseline. A group's amax is all-reduced as the bits of |x| (int32
MAX), which is the order `lowp.quantize` takes its maximum in, NaN and Inf included.
"""

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
        """The all-gather inputs: the shard's codes and scales for the forward, and for
        the dgrad where it does not reuse them (module docstring), each along dim 0."""
        n = outer_size[0]
        group, ranks = mesh.get_group(), mesh.size()
        if n % ranks:
            raise ValueError(
                f"{self.layer_name}: out_features={n} is not a multiple of the {ranks} FSDP ranks; "
                "a quantized all-gather needs even shards (leave the layer out of "
                "fsdp_quantized_all_gather, or pick a mesh that divides it)"
            )
        local = self.data_
        if mp_policy.param_dtype is not None:
            local = local.to(mp_policy.param_dtype)
        quantized = [
            _quantize_shard(local, self.plan.forward.b.scheme, group, ranks, self.layer_name)
        ]
        dgrad = self.plan.transposed_operand("w")
        if not dgrad.reuses_codes:
            quantized.append(
                _quantize_shard(local, dgrad.along_first_axis, group, ranks, self.layer_name)
            )
        inputs = []
        for q in quantized:
            scale = q.scale.reshape(1) if q.scale.dim() == 0 else q.scale
            inputs += [q.codes, scale]
        return tuple(inputs), local.dtype

    def fsdp_post_all_gather(self, outputs, metadata, param_dtype, *, out=None):
        """The unsharded weight: a GatheredWeight whose operands are views of the gathered
        codes and scales. A later gather refills those very buffers, so `out` (the weight
        made by the first) is already up to date."""
        if out is not None:
            return None
        hp_dtype = metadata
        n, k = outputs[0].shape[0], outputs[0].shape[1]
        dgrad = self.plan.transposed_operand("w")
        schemes = [self.plan.forward.b.scheme]
        if not dgrad.reuses_codes:
            schemes.append(dgrad.along_first_axis)
        operands = []
        for i, scheme in enumerate(schemes):
            codes, scale = outputs[2 * i], outputs[2 * i + 1]
            operands.append(
                QuantizedTensor(
                    codes, _gathered_scale(scale, scheme, n, k), None, scheme, (n, k), hp_dtype
                )
            )
        return GatheredWeight(operands[0], operands[-1], self.plan), ()


def _quantize_shard(local, scheme, group, ranks: int, name: str) -> QuantizedTensor:
    """`local` (rows of w) quantized with `scheme` as the full w would be: rows of codes
    and scales that concatenate, across shards, into `lowp.quantize`'s of w."""
    t0, t1 = scheme.tiles(2)
    if t0 is not None:  # groups of t0 rows: a shard must hold whole ones
        if local.shape[0] % t0:
            raise ValueError(
                f"{name}: a shard of {local.shape[0]} rows (out_features / {ranks} ranks) "
                f"splits the {t0}-row blocks of {scheme}; the quantized all-gather would "
                "not give the unsharded bytes. Shard so each rank's out_features is a "
                f"multiple of {t0}, or leave the layer out"
            )
        return _quantize.quantize(local, scheme, name=name)
    # Groups span every shard's rows (tensorwise; columns): all-reduce each group's amax,
    # as int32 bits of |x|, and quantize the shard with one extra row holding it, which
    # sets each group's amax to the whole tensor's without changing any other code.
    amax_bits = _bits.abs_bits(local.float())
    amax_bits = amax_bits.amax() if t1 is None else amax_bits.amax(dim=0)
    dist.all_reduce(amax_bits, op=dist.ReduceOp.MAX, group=group)
    amax_row = _bits.from_bits(amax_bits).to(local.dtype).expand(1, local.shape[1])
    q = _quantize.quantize(torch.cat([local, amax_row]), scheme, name=name)
    return QuantizedTensor(
        q.codes[:-1], q.scale, None, scheme, (local.shape[0], local.shape[1]), local.dtype
    )


def _gathered_scale(scale, scheme, n: int, k: int) -> torch.Tensor:
    """The full weight's scales from the gathered shards' (concatenated along dim 0):
    row groups concatenate; a group every shard shares (a tensor's, a column's) was
    made equal on every shard by the all-reduce, so the first shard's is it."""
    t0, _ = scheme.tiles(2)
    if t0 is not None:
        return scale
    return scale[:1].reshape(scheme.scale_shape((n, k)))


class GatheredWeight(torch.Tensor):
    """The unsharded weight FSDP2 hands a layer in its forward and backward: w (N, K),
    but holding only its gathered operands, `forward` (w along K, the forward's b) and
    `dgrad` (w along N, which the dgrad reads transposed; the forward's codes where the
    plan reuses them). The training layer takes them through `lowp_gathered_operands`;
    any other use of the values is refused, since there are none to give."""

    @staticmethod
    def __new__(cls, forward: QuantizedTensor, dgrad: QuantizedTensor, plan, requires_grad=False):
        self = torch.Tensor._make_wrapper_subclass(
            cls,
            forward.shape,
            dtype=forward.dtype,
            device=forward.device,
            requires_grad=requires_grad,
        )
        self.forward, self.dgrad, self.plan = forward, dgrad, plan
        return self

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        return f"GatheredWeight(shape={tuple(self.shape)}, recipe={self.plan.recipe.name!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        w = args[0]
        whole = func is aten.as_strided.default and tuple(args[1]) == tuple(w.shape)
        if whole or func in (aten.detach.default, aten.alias.default):
            return cls(w.forward, w.dgrad, w.plan)  # FSDP2 views the weight at its own shape
        raise TypeError(
            f"{func}: a weight FSDP2 gathered as {w.plan.recipe.name} codes holds no "
            "high-precision values; only lowp_torch.Linear reads it"
        )

    def lowp_gathered_operands(self, forward_b):
        """(b of the forward, what the dgrad's w.T takes of w): `_training.forward_operands`'s
        answer for this weight, from the gathered codes."""
        gathered = _qtensor.scheme_of(self.forward)
        if forward_b.scheme != gathered or not forward_b.plain:
            raise ValueError(
                f"gathered codes are {gathered} with nearest rounding and no transform; the "
                f"forward wants {forward_b.scheme} with {forward_b.rounding} rounding"
                + (" and the Hadamard transform" if forward_b.hadamard else "")
            )
        return self.forward, self.dgrad


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
