"""The tiny LM in PyTorch: bf16 autocast, or a lowp recipe on the block projections.

    python examples/train_tiny_lm/train_torch.py [--runs bf16,mxfp8] [--size tiny]
        [--steps N] [--device gpu] [--json OUT]

`run.py` trains both frameworks and draws the comparison; this script trains PyTorch
alone and prints its losses. The model, data and precision are described in
`tinylm.py`.
"""

import math
import os

import numpy as np
import tinylm
import torch
import torch.nn.functional as F
from torch import nn

import lowp_torch


class Attention(nn.Module):
    def __init__(self, cfg: tinylm.Config):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # Scores and softmax in float32 (autocast gives the matmul bf16), as train_jax does.
        scores = (q @ k.transpose(-1, -2)).float() * (d // self.heads) ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        probs = scores.masked_fill(~causal, -math.inf).softmax(-1)
        out = (probs @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: tinylm.Config):
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.fc2 = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x).float()))


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (`tinylm` module docstring); recipe None: bf16."""

    def __init__(self, cfg: tinylm.Config, recipe=None):
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.d_model, cfg.experts, bias=False)
        self.experts = lowp_torch.GroupedExperts(
            cfg.d_model, 2 * cfg.d_model, cfg.experts, recipe=recipe
        )

    def forward(self, x):
        b, t, d = x.shape
        flat = x.reshape(-1, d).float()
        with torch.autocast(x.device.type, enabled=False):
            probs = F.linear(flat, self.router.weight).softmax(-1)
            gates, expert = torch.topk(probs, self.top_k, dim=-1)
            gates = gates / gates.sum(-1, keepdim=True)
            # the (token, choice) pairs sorted by expert, each expert's a run of rows
            order = torch.argsort(expert.flatten(), stable=True)
            token = order // self.top_k
            counts = torch.bincount(expert.flatten(), minlength=self.router.out_features)
            y = self.experts(flat[token].to(torch.bfloat16), counts)
            weighted = y.float() * gates.flatten()[order, None]
            out = torch.zeros_like(flat).index_add_(0, token, weighted)
        return out.view(b, t, d)


class Block(nn.Module):
    def __init__(self, cfg: tinylm.Config, recipe=None):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        if cfg.ffn == "moe":
            self.moe = MoE(cfg, recipe)
        else:
            self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + (self.moe if hasattr(self, "moe") else self.mlp)(self.ln2(x))


class TinyLM(nn.Module):
    """The pre-LN byte-level decoder of `tinylm`; tokens (B, T) int -> logits (B, T, 256)."""

    def __init__(self, cfg: tinylm.Config, expert_recipe=None):
        super().__init__()
        self.tok_emb = nn.Embedding(tinylm.VOCAB, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, expert_recipe) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, tinylm.VOCAB, bias=False)

    def forward(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(cfg: tinylm.Config, run: str, params: dict, device="cpu") -> TinyLM:
    """The model with `params` loaded; for a recipe, its block projections converted
    by `lowp_torch.convert_to_training` (the LM head and MoE routers are left as they
    are) and its MoE experts' grouped GEMMs quantized by it. small_shapes=
    "quantize": the runs compare the recipes' numerics, and on a GPU the default policy
    would keep these small layers in high precision (bf16 speed beats fp8 there)."""
    recipe = None if run == "bf16" else tinylm.recipe_of(run)
    model = TinyLM(cfg, expert_recipe=recipe)  # MoE experts: grouped GEMMs of the recipe
    model.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    if recipe is not None:
        lowp_torch.convert_to_training(
            model,
            recipe,
            filter_fn=lambda module, name: name != "head" and not name.endswith("router"),
            small_shapes="quantize",
        )
    return model.to(device)


class Trainer:
    """One run's model and AdamW state; the interface `tinylm.train` drives.

    device: "cpu", "gpu" (CUDA) or any torch device.
    """

    def __init__(self, cfg: tinylm.Config, run: str, params: dict, device="cpu"):
        self.cfg, self.device = cfg, torch.device("cuda" if device == "gpu" else device)
        self.model = build_model(cfg, run, params, self.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
        )
        self.lrs = tinylm.learning_rates(cfg)

    def _loss(self, tokens: np.ndarray) -> torch.Tensor:
        tokens = torch.from_numpy(tokens).to(self.device, torch.long)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            logits = self.model(tokens[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())

    def step(self, step: int, tokens: np.ndarray) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = float(self.lrs[step])
        loss = self._loss(tokens)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    @torch.no_grad()
    def eval_loss(self, tokens: np.ndarray) -> float:
        return self._loss(tokens).item()

    def save(self, path) -> None:
        torch.save(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path
        )

    def load(self, path) -> None:
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def params(self) -> dict[str, np.ndarray]:
        """Copies: on the CPU, .numpy() would share memory the optimizer updates in place."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}


def deterministic() -> None:
    """cuBLAS with a fixed workspace split and PyTorch's deterministic kernels (an op
    without one warns). lowp's own Triton casts are deterministic as they are: their
    only atomics take maxima, which do not depend on order."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)


if __name__ == "__main__":
    raise SystemExit(
        tinylm.cli("torch", Trainer, __doc__.splitlines()[0], deterministic=deterministic)
    )
