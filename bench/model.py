"""A Llama-3-8B-shaped model slice, trained and served as users run it: lowp's default
settings against bf16 and torchao, in PyTorch.

The model: two decoder-layer slices of Llama-3-8B (dim 4096), each an attention-projection
block (RMSNorm; q, o 4096 -> 4096; k, v 4096 -> 1024; residual) and a SwiGLU FFN block
(RMSNorm; w1, w3 4096 -> 14336; w2 14336 -> 4096; residual). Attention itself is replaced by
an elementwise product of q with the repeated k·v, so that every GEMM of the slice is a
linear layer's and the ratios say what quantizing the linears buys.

    training   forward + backward of the whole slice on x (2, T/2, 4096) with a random
               cotangent, at T = 2048 ... 16384 tokens; variants: bf16, lowp's
               `convert_to_training(model, recipe)` with every default, torchao's
               `convert_to_float8_training` (tensorwise, rowwise);
    inference  the forward under `torch.inference_mode` on x (1, T, 4096), T = 1 ... 8192;
               variants: bf16, `lowp_torch.quantize_(model, preset)` with every default,
               torchao's `Float8DynamicActivationFloat8WeightConfig` (PerTensor, PerRow).

Each variant runs eager and `torch.compile`d, and on request (mode "cudagraphs") compiled
with `mode="reduce-overhead"`, which replays the step as a CUDA graph: decode, where the
launches of a step cost more host time than its kernels take on the device, runs so in
serving engines. Every variant of one T is timed interleaved in
one process (`_timing.time_interleaved`); a variant's first call (compilation, for a
compiled one) is timed apart as `first_call_s`. bench/run.py runs these as its "model_train" and "model_infer" sections; the
summary's ratios are over the faster bf16 of the row.
"""

import dataclasses
import time

import torch
import torch.nn.functional as F
from torch import nn

import lowp_torch
from bench import _timing, linear_step


@dataclasses.dataclass(frozen=True)
class Shape:
    dim: int = 4096
    kv: int = 1024
    ffn: int = 14336
    layers: int = 2


LLAMA3_8B = Shape()
TINY = Shape(dim=64, kv=16, ffn=128, layers=1)
TRAIN_TOKENS = (2048, 4096, 8192, 16384)
INFER_TOKENS = (1, 16, 128, 1024, 8192)
TRAIN_RECIPES = ("float8_tensorwise", "float8_rowwise")
INFER_PRESETS = ("float8_tensorwise", "float8_rowwise")
MODES = ("eager", "compiled")  # and "cudagraphs", asked for by name
_COMPILE_OPTIONS = {"compiled": {}, "cudagraphs": {"mode": "reduce-overhead"}}


class AttentionProjections(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.norm = nn.RMSNorm(s.dim)
        self.q = nn.Linear(s.dim, s.dim, bias=False)
        self.k = nn.Linear(s.dim, s.kv, bias=False)
        self.v = nn.Linear(s.dim, s.kv, bias=False)
        self.o = nn.Linear(s.dim, s.dim, bias=False)
        self.repeat = s.dim // s.kv

    def forward(self, x):
        h = self.norm(x)
        kv = (self.k(h) * self.v(h)).repeat_interleave(self.repeat, dim=-1)
        return x + self.o(self.q(h) * kv)


class FeedForward(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.norm = nn.RMSNorm(s.dim)
        self.w1 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w3 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w2 = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def make_model(s: Shape, device) -> nn.Module:
    """The slice in bf16, with the same seeded weights every call."""
    torch.manual_seed(0)
    blocks = []
    for _ in range(s.layers):
        blocks += [AttentionProjections(s), FeedForward(s)]
    model = nn.Sequential(*blocks).to(device, torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(0.5)  # nn.Linear's init, halved: the residual stream stays O(1)
    return model


def torchao_problem() -> str | None:
    return linear_step.torchao_problem()


def _train_variant(variant: str, s: Shape, device) -> nn.Module:
    model = make_model(s, device)
    if variant == "bf16":
        return model
    if variant.startswith("lowp_"):
        return lowp_torch.convert_to_training(model, variant.removeprefix("lowp_"))
    if variant.startswith("torchao_"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(variant.removeprefix("torchao_"))
        return convert_to_float8_training(model, config=config)
    raise ValueError(f"unknown training variant {variant!r}")


def _infer_variant(variant: str, s: Shape, device) -> nn.Module:
    model = make_model(s, device).eval()
    if variant == "bf16":
        return model
    if variant.startswith("lowp_"):
        return lowp_torch.quantize_(model, variant.removeprefix("lowp_"))
    if variant.startswith("torchao_"):
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, quantize_
        from torchao.quantization.granularity import PerRow, PerTensor

        granularity = {"tensorwise": PerTensor(), "rowwise": PerRow()}[
            variant.removeprefix("torchao_")
        ]
        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=granularity))
        return model
    raise ValueError(f"unknown inference variant {variant!r}")


def train_variants(device) -> list[str]:
    out = ["bf16"] + [f"lowp_{r}" for r in TRAIN_RECIPES]
    if device.type == "cuda" and torchao_problem() is None:
        out += ["torchao_tensorwise", "torchao_rowwise"]
    return out


def infer_variants(device) -> list[str]:
    out = ["bf16"] + [f"lowp_{p}" for p in INFER_PRESETS]
    if device.type == "cuda" and torchao_problem() is None:
        out += ["torchao_tensorwise", "torchao_rowwise"]
    return out


def measure(
    task: str,
    tokens: int,
    s: Shape,
    device,
    timing: _timing.Timing,
    modes=MODES,
    backend: str = "inductor",
    on_error=None,
    only: tuple = (),
) -> list[dict]:
    """One row per (variant, mode) of `task` ("train" or "infer") at `tokens` tokens, all
    timed interleaved. on_error(label, exception) takes a variant that fails to build or
    run; the others are still timed. only: these variants alone (default: every one)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    batch = 2 if task == "train" and tokens % 2 == 0 else 1
    x = torch.randn(batch, tokens // batch, s.dim, generator=gen).to(device, torch.bfloat16)
    dy = torch.randn(x.shape, generator=gen).to(device, torch.bfloat16)
    variants = train_variants(device) if task == "train" else infer_variants(device)
    if only:
        unknown = sorted(set(only) - set(variants))
        if unknown:
            raise ValueError(f"no {task} variant {unknown} here; there are {variants}")
        variants = [v for v in variants if v in only]
    build_model = _train_variant if task == "train" else _infer_variant

    first_call_s = {}

    def build(label):
        variant, mode = label
        model = build_model(variant, s, device)
        if mode != "eager":
            model = torch.compile(model, backend=backend, dynamic=False, **_COMPILE_OPTIONS[mode])
        call = _train_call(model, x, dy) if task == "train" else _infer_call(model, x)
        start = time.perf_counter()
        call()  # a failure to build or compile belongs to this variant
        _timing.torch_sync(device)()
        first_call_s[label] = time.perf_counter() - start
        return call

    labels = [(v, m) for v in variants for m in modes]
    kept, calls = _timing.build_each(
        labels, build, None if on_error is None else lambda label, e: on_error(label, e)
    )
    measured = _timing.time_interleaved(calls, _timing.torch_sync(device), timing)
    return [
        {
            "framework": "torch",
            "task": task,
            "T": tokens,
            "variant": variant,
            "mode": mode,
            "ms": round(r.ms, 4),
            "first_call_s": round(first_call_s[variant, mode], 2),
            "iters": r.iters,
        }
        for (variant, mode), r in zip(kept, measured, strict=True)
    ]


def _train_call(model, x, dy):
    params = list(model.parameters())

    def call():
        for p in params:
            p.grad = None
        model(x).backward(dy)

    return call


def _infer_call(model, x):
    def call():
        with torch.inference_mode():
            model(x)

    return call


def format_row(row: dict) -> str:
    return (
        f"{row['framework']:>5} {row['task']:>5} T={row['T']:>6} {row['variant']:>20} {row['mode']:>8}: "
        f"{row['ms']:9.4f} ms (first call {row['first_call_s']:.1f} s)"
    )
