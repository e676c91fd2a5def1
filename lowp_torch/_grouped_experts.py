"""`GroupedExperts`: the stacked-expert SwiGLU feed-forward of an MoE layer (torchtitan's
pattern), in high precision or with a lowp recipe's grouped GEMMs (`grouped_mm`).

Converting a model: `convert_experts_to_training(model, recipe)` gives every module with
3-D `w1`, `w2`, `w3` parameters (torchtitan's `GroupedExperts` and this one) a lowp
`GroupedExperts` that shares those parameters and runs its three grouped GEMMs with the
recipe. docs/moe.md shows it.
"""

import torch
import torch.nn.functional as F
from torch import nn

import lowp
from lowp_torch import _grouped_mm, _qtensor, _quantize


class GroupedExperts(nn.Module):
    """E SwiGLU experts, `out[e] = (silu(x[e] w1[e]^T) * (x[e] w3[e]^T)) w2[e]^T`, over
    tokens sorted by expert.

    Attributes:
      w1, w3: (E, hidden, dim); w2: (E, dim, hidden): each expert's weights as
        `nn.Linear` weights, (out_features, in_features).
      recipe: None (bf16 `torch._grouped_mm` on CUDA, float32 emulation elsewhere) or a
        `lowp.Recipe` / its name for `lowp_torch.grouped_mm`.

    >>> import torch
    >>> experts = GroupedExperts(dim=32, hidden=64, num_experts=2, recipe="float8_rowwise")
    >>> experts(torch.randn(5, 32), torch.tensor([2, 3])).shape
    torch.Size([5, 32])
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, recipe=None, dtype=None):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden, dtype=dtype))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim, dtype=dtype))
        self.recipe = recipe
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw each expert weight from a normal of std 1/sqrt(fan-in) (`trunc_normal_`, whose
        cutoffs at +-2 lie far outside such a std)."""
        for w in (self.w1, self.w2, self.w3):
            nn.init.trunc_normal_(w, std=w.shape[-1] ** -0.5)

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        offs = torch.cumsum(num_tokens_per_expert, 0, dtype=torch.int32)
        h = F.silu(self._mm(x, self.w1, offs)) * self._mm(x, self.w3, offs)
        return self._mm(h, self.w2, offs)

    def _mm(self, x, w, offs):
        if isinstance(w, _qtensor.QuantizedTensor):  # `quantize_experts_`
            return _grouped_mm.quantized_grouped_mm(
                x, w, offs, getattr(self, "activation", None), name="GroupedExperts"
            )
        if self.recipe is not None:
            return _grouped_mm.grouped_mm(x, w, offs, self.recipe, name="GroupedExperts")
        if x.is_cuda:
            return torch._grouped_mm(x, w.to(x.dtype).transpose(-2, -1), offs=offs)
        return _HighPrecision.apply(x, w, offs)

    @classmethod
    def from_float(cls, module: nn.Module, recipe) -> "GroupedExperts":
        """A lowp GroupedExperts sharing `module`'s w1, w2, w3 (3-D, nn.Linear layout)."""
        w1, w2, w3 = module.w1, module.w2, module.w3
        for name, w in (("w1", w1), ("w2", w2), ("w3", w3)):
            if not isinstance(w, nn.Parameter) or w.dim() != 3:
                raise ValueError(f"{type(module).__name__}.{name} must be a 3-D parameter")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.w1, new.w2, new.w3, new.recipe = w1, w2, w3, recipe
        return new


class _HighPrecision(torch.autograd.Function):
    """The float32 grouped GEMM of the CPU (torch._grouped_mm's bf16 CPU kernel wants
    aligned shapes): y in x's dtype, dx and dw rounded once from float32."""

    @staticmethod
    def forward(ctx, x, w, offs):
        ctx.save_for_backward(x, w, offs)
        return _grouped_mm._grouped_f32(x.float(), w.float(), offs).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w, offs = ctx.saved_tensors
        dx = _grouped_mm._grouped_f32(dy.float(), w.float().transpose(-2, -1), offs)
        dw = _grouped_mm._grouped_wgrad_f32(dy.float(), x.float(), offs)
        return dx.to(x.dtype), dw.to(w.dtype), None


def convert_experts_to_training(model: nn.Module, recipe, filter_fn=None) -> nn.Module:
    """Replace, in place, every submodule with 3-D `w1`, `w2`, `w3` parameters (and a
    `forward(x, num_tokens_per_expert)`, torchtitan's `GroupedExperts`) by a lowp
    `GroupedExperts` sharing its parameters and running `recipe`'s grouped GEMMs.
    `filter_fn(module, fqn)` may skip some. Returns the model."""
    for fqn, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            child_fqn = f"{fqn}.{child_name}" if fqn else child_name
            if not all(
                isinstance(getattr(child, n, None), nn.Parameter) for n in ("w1", "w2", "w3")
            ):
                continue
            if child.w1.dim() != 3 or (filter_fn and not filter_fn(child, child_fqn)):
                continue
            setattr(module, child_name, GroupedExperts.from_float(child, recipe))
    return model


def quantize_experts_(model: nn.Module, config) -> nn.Module:
    """Inference: quantize, in place, the w1, w2, w3 of every `GroupedExperts` of `model`
    with `config` (a `lowp.InferenceConfig` or preset name) into QuantizedTensors
    (E, N, K); each call then quantizes its tokens with the config's activation scheme
    (`quantized_grouped_mm`). The weight scheme must keep experts apart: rowwise or MX
    (ValueError for tensorwise, whose one scale would cover every expert)."""
    if isinstance(config, str):
        config = lowp.InferenceConfig.from_name(config)
    if isinstance(config.weight, lowp.TensorScaling):
        raise ValueError(  # noqa: TRY004 - a valid scheme, not one for experts
            f"quantize_experts_: {config.weight} has one scale for every expert; use a "
            "rowwise or MX preset (one scale never covers two experts)"
        )
    for module in model.modules():
        if not isinstance(module, GroupedExperts):
            continue
        for name in ("w1", "w2", "w3"):
            w = getattr(module, name).detach()
            q = _quantize.quantize(w, config.weight, name=name)
            setattr(module, name, nn.Parameter(q, requires_grad=False))
        module.activation = config.activation
    return model
