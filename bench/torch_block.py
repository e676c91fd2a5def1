"""A transformer block's training step in PyTorch, bf16 and per recipe: time and memory.

The block is a Llama-style pre-norm decoder layer (RMSNorm, causal attention through
`F.scaled_dot_product_attention`, RMSNorm, SwiGLU MLP; no rotary embedding, which
touches no linear) in bfloat16. A recipe converts its four linears with
`lowp_torch.convert_to_training`; norms and attention stay bf16, as in a real model.
The step is `zero_grad; block(x).backward(dy); AdamW.step()` with a random cotangent,
the optimizer eager (fused on CUDA) and, in "compiled" mode, the block under
`torch.compile`.

Peak memory is `torch.cuda.max_memory_allocated` over one step taken after the
optimizer state exists; "resident" is what is allocated before it (parameters,
optimizer state, inputs), "step_extra" the rise during it: the activations saved for
the backward, the gradients and the temporaries, where a recipe's fp8 residuals show.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

import lowp_torch
from bench import _timing

MIB = 2**20


@dataclasses.dataclass(frozen=True)
class BlockShape:
    dim: int
    heads: int
    ffn: int
    batch: int
    seq: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class Block(nn.Module):
    def __init__(self, shape: BlockShape):
        super().__init__()
        d, f = shape.dim, shape.ffn
        self.heads = shape.heads
        self.attn_norm = nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.mlp_norm = nn.RMSNorm(d)
        self.gate_up = nn.Linear(d, 2 * f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        qkv = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attn.transpose(1, 2).reshape(b, s, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def _setup(recipe: str, shape: BlockShape, device):
    """The block (same initial weights for every recipe), its optimizer, x and dy."""
    torch.manual_seed(0)
    block = Block(shape).to(device, torch.bfloat16)
    if recipe != "bf16":
        lowp_torch.convert_to_training(block, recipe)
    optimizer = torch.optim.AdamW(block.parameters(), lr=1e-5, fused=device.type == "cuda")
    x = torch.randn(shape.batch, shape.seq, shape.dim, device=device, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    return block, optimizer, x, dy


def measure(recipe: str, mode: str, shape: BlockShape, device, timing, backend: str) -> dict:
    """One row: the step's median time (None when `timing` is None: memory only) and
    its peak memory (None off CUDA)."""
    block, optimizer, x, dy = _setup(recipe, shape, device)
    model = torch.compile(block, backend=backend, dynamic=False) if mode == "compiled" else block

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(x).backward(dy)
        optimizer.step()

    row = {"recipe": recipe, "mode": mode, **dataclasses.asdict(shape), "tokens": shape.tokens}
    sync = _timing.torch_sync(device)
    if timing is None:
        step()  # creates the optimizer state and compiles
        sync()
        row["ms"] = None
    else:
        result = _timing.time_calls(step, sync, timing)
        row |= {
            "ms": round(result.ms, 4),
            "tokens_per_s": round(shape.tokens / (result.ms * 1e-3)),
            "warmup_s": round(result.warmup_s, 2),
            "iters": result.iters,
        }
    return row | _peak_memory(step, device)


def _peak_memory(step, device) -> dict:
    if device.type != "cuda":
        return {"peak_mib": None, "resident_mib": None, "step_extra_mib": None}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    resident = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {
        "peak_mib": round(peak / MIB, 1),
        "resident_mib": round(resident / MIB, 1),
        "step_extra_mib": round((peak - resident) / MIB, 1),
    }


def format_row(row: dict) -> str:
    shape = f"dim {row['dim']} ffn {row['ffn']} tokens {row['tokens']}"
    time_part = "" if row["ms"] is None else f"{row['ms']:9.3f} ms "
    memory = (
        "peak memory n/a (not CUDA)"
        if row["peak_mib"] is None
        else f"peak {row['peak_mib']:.0f} MiB (resident {row['resident_mib']:.0f} + step "
        f"{row['step_extra_mib']:.0f})"
    )
    return f"{shape} {row['recipe']:>22} {row['mode']:>8}: {time_part}{memory}"
