"""Does NVFP4's random Hadamard transform make the weight gradient more accurate on a real
transformer's operands? The wgrad `dw = g.T @ x` of `nvfp4` and its ablation variants on
the inputs x and output gradients g of every Linear of all-MiniLM-L6-v2, and on synthetic
operands with LLM-like outliers, over many draws of the signs and of the rounding bits.

    python -m bench.probes.nvfp4_rht_operands [--draws 16] [--batch 8] [--seq 128] \
        [--json bench/results/DATE_COMMIT_nvfp4_rht_operands.json]

Operands (float32 holding bf16 values, as a bf16 layer sees them; M = batch * seq tokens):

  minilm      MiniLM (`lowp_apps.models.torch_minilm`, float32) on `batch` sequences of
              `seq` WordPiece tokens of this repository's README and docs/*.md, each
              [CLS] ... [SEP], no padding; 15% of the other tokens replaced by [MASK] and
              predicted through the tied word embeddings (cross-entropy on the masked
              tokens; `--loss all`: on every token, each predicting its own, so every
              token has a gradient, as in a causal LM): a masked-LM loss, so every
              Linear's output gradient is a real backward pass's. Captured per Linear (6 layers x query, key, value,
              attention output, FFN in, FFN out).
  gaussian    g, x iid N(0, 1), (M, 384) each: the control, nothing to spread.
  channels    x with 4 of its 384 channels 50x larger (LLM.int8()'s outlier features).
              Along the tokens, the axis the wgrad reduces and the transform mixes, such a
              channel is large at every token, so no block of 16 holds a lone spike.
  massive     x with 2 channels 100x larger at 1 token in 64 (massive activations at
              delimiter and first tokens): a lone spike in its block of 16 tokens.

Each variant's wgrad operands are made as its `OperandPlan`s say: transformed along M
with `hadamard.signs(seed, "", (M,))` where the variant has the transform, then
`lowp.quantize` with the operand's scheme and rounding (x to nearest; g stochastically
where the variant says). Dequantized, they are multiplied in float64 against the exact
float64 `g.T @ x` of the same bf16 values. Two measurements:

  per step    draw d takes the signs of seed d and the stochastic bits of seed d, so a
              variant's spread over draws is what one training step sees for some
              random signs. SQNR = 10 log10(|dw|^2 / |dw_q - dw|^2). Reported: the mean
              and standard deviation over draws, and for the two comparisons that isolate
              the transform (nvfp4 - nvfp4_no_rht with SR; nvfp4_no_sr - nvfp4_plain
              without) the mean paired difference per draw with its standard error.
  averaged    the signs fixed at seed 0 (as in training), the stochastic bits of seed d:
              the SQNR of the mean of dw_q over the draws, what averaging over steps
              leaves (a bias shows as a ceiling).

Per operand pair it also records each operand's own statistics along M, before and
after the transform (signs of seed 0): the mean over blocks of 16 of amax / rms (the
transform lowers it where a block holds a lone spike), the operand's SQNR rounded to
nearest (the transform is orthonormal, so its error is the same in either basis), and
per variant the fraction of elements quantized to zero.
The table prints each MiniLM projection kind averaged over the 6 layers, then each
synthetic kind.

    python -m bench.probes.nvfp4_rht_operands --distributions

prints, in seconds, the same operand statistics for iid values of a few distributions
(uniform, Gaussian, Laplace, Student's t with 3 degrees of freedom, 90% zeros): the
transform brings every operand's SQNR to about the Gaussian one's.
"""

import argparse
import json
import pathlib
import time

import ml_dtypes
import numpy as np

import lowp
from lowp import _bits
from lowp import _hadamard as hadamard
from lowp.extend import LinearPlan

VARIANTS = ("nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_plain")
SYNTHETIC = ("gaussian", "channels", "massive")
KINDS = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def bf16(a) -> np.ndarray:
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def minilm_operands(
    batch: int, seq: int, loss_on: str = "masked"
) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """[(name, g (M, N), x (M, K))] for every Linear of MiniLM under a masked-LM loss."""
    import torch
    import torch.nn.functional as F

    from lowp_apps.models.torch_minilm import MiniLM

    torch.manual_seed(0)
    model = MiniLM.from_pretrained()
    tok = model.tokenizer
    text = "\n".join(
        p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    )
    stream = [tok.vocab[t] for t in tok.tokenize(text)]
    body = seq - 2
    if len(stream) < batch * body:
        raise ValueError(f"the docs hold {len(stream)} tokens, fewer than {batch * body}")
    ids = np.array(
        [[tok.cls_id, *stream[i * body : (i + 1) * body], tok.sep_id] for i in range(batch)]
    )
    rng = np.random.default_rng(0)
    masked = np.zeros(ids.shape, bool)
    masked[:, 1:-1] = rng.random((batch, body)) < 0.15
    targets = torch.from_numpy(ids.copy())
    ids[masked] = tok.vocab["[MASK]"]
    captured: dict[str, dict] = {}

    def hook(name):
        def forward(module, inputs, output):
            captured[name] = {"x": inputs[0].detach().reshape(-1, inputs[0].shape[-1])}
            output.register_hook(
                lambda grad: captured[name].__setitem__("g", grad.reshape(-1, grad.shape[-1]))
            )

        return forward

    names = {
        "attention.self.query": "query",
        "attention.self.key": "key",
        "attention.self.value": "value",
        "attention.output.dense": "attn_out",
        "intermediate.dense": "ffn_in",
        "output.dense": "ffn_out",
    }
    for i, layer in enumerate(model.encoder.layer):
        for path, kind in names.items():
            layer.get_submodule(path).register_forward_hook(hook(f"{i}.{kind}"))
    hidden = model(torch.from_numpy(ids), torch.ones(ids.shape, dtype=torch.int64))
    logits = hidden @ model.embeddings.word_embeddings.weight.T
    mask = torch.from_numpy(masked) if loss_on == "masked" else torch.ones(ids.shape, dtype=bool)
    loss = F.cross_entropy(logits[mask], targets[mask])
    loss.backward()
    print(f"MiniLM masked-LM loss {loss.item():.3f} on {int(mask.sum())} tokens ({loss_on})")
    return [
        (name, bf16(c["g"].numpy()), bf16(c["x"].numpy()))
        for name, c in sorted(captured.items(), key=lambda kv: (int(kv[0].split(".")[0]), kv[0]))
    ]


def synthetic_operands(kind: str, m: int, n: int = 384, k: int = 384):
    rng = np.random.default_rng(1)
    g, x = rng.standard_normal((m, n)), rng.standard_normal((m, k))
    if kind == "channels":
        x[:, rng.choice(k, 4, replace=False)] *= 50
    elif kind == "massive":
        x[np.ix_(np.arange(0, m, 64), rng.choice(k, 2, replace=False))] *= 100
    elif kind != "gaussian":
        raise ValueError(f"kind must be one of {SYNTHETIC}, got {kind!r}")
    return bf16(g), bf16(x)


def operand(t: np.ndarray, scheme, *, sign_seed: int | None, sr_seed: int | None):
    """t (the GEMM's operand, reduced along its last axis) transformed with the signs of
    `sign_seed` (None: not transformed), quantized (stochastically with `sr_seed`, else to
    nearest), dequantized (float32 holds it exactly); and the fraction of its codes that are zero."""
    t = _bits.ftz(np.ascontiguousarray(t, np.float32))
    if sign_seed is not None:
        t = hadamard.transform_numpy(t, hadamard.signs(sign_seed, "", (t.shape[-1],)))
    kwargs = {} if sr_seed is None else {"rounding": "stochastic", "seed": sr_seed}
    q = np.asarray(lowp.dequantize(lowp.quantize(t, scheme, **kwargs)), np.float32)
    return q, float(np.mean(q == 0))


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((got - ref) ** 2)))


def block_crest(t: np.ndarray) -> float:
    """Mean over blocks of 16 along the last axis of amax / rms (blocks of zeros skipped)."""
    b = t.reshape(-1, 16).astype(np.float64)
    rms = np.sqrt(np.mean(b**2, axis=1))
    keep = rms > 0
    return float(np.mean(np.max(np.abs(b[keep]), axis=1) / rms[keep]))


def measure(g: np.ndarray, x: np.ndarray, draws: int) -> dict:
    """Every variant's per-step SQNRs (one per draw), averaged SQNR, and the operands'
    block statistics, for the wgrad of output gradient g (M, N) and input x (M, K)."""
    exact = g.T.astype(np.float64) @ x.astype(np.float64)
    gt, xt = np.ascontiguousarray(g.T), np.ascontiguousarray(x.T)
    m = g.shape[0]
    out: dict = {"stats": {}}
    transformed = {}
    for name, t in (("g", gt), ("x", xt)):
        rht = hadamard.transform_numpy(_bits.ftz(t), hadamard.signs(0, "", (m,)))
        transformed[name] = (t, rht)
        out["stats"][name] = {"crest": block_crest(t), "crest_rht": block_crest(rht)}
    # quantized operands by (sign seed or None, stochastic seed or None): variants share them
    cache: dict = {}

    def q(name, t, scheme, sign, sr):
        key = (name, sign, sr)
        if key not in cache:
            cache[key] = operand(t, scheme, sign_seed=sign, sr_seed=sr)
        return cache[key]

    for variant in VARIANTS:
        plan = LinearPlan.of(lowp.Recipe.from_name(variant)).wgrad
        rht, sr = plan.a.hadamard, plan.a.rounding == "stochastic"
        per_step, zeros = [], {"g": [], "x": []}
        # per step: signs and bits of seed d
        for d in range(draws):
            sign = d if rht else None
            b, zb = q("x", xt, plan.b.scheme, sign, None)
            a, za = q("g", gt, plan.a.scheme, sign, d if sr else None)
            per_step.append(sqnr(exact, a.astype(np.float64) @ b.T.astype(np.float64)))
            zeros["g"].append(za)
            zeros["x"].append(zb)
            if not rht and not sr:
                per_step *= draws  # nothing random: every draw is the same
                break
        # averaged: signs of seed 0, bits of seed d
        sign = 0 if rht else None
        b, _ = q("x", xt, plan.b.scheme, sign, None)
        total = 0.0
        for d in range(draws if sr else 1):
            a, _ = q("g", gt, plan.a.scheme, sign, d if sr else None)
            total = total + a.astype(np.float64) @ b.T.astype(np.float64)
        out[variant] = {
            "sqnr_per_step": per_step,
            "sqnr_averaged": sqnr(exact, total / (draws if sr else 1)),
            "zero_fraction": {k: float(np.mean(v)) for k, v in zeros.items()},
        }
    # each operand's own error, rounded to nearest, without and with the transform (seed 0;
    # the transform is orthonormal, so the error is the same measured in either basis)
    for name, (t, rht) in transformed.items():
        stats = out["stats"][name]
        stats["sqnr"] = sqnr(t.astype(np.float64), cache[name, None, None][0])
        stats["sqnr_rht"] = sqnr(rht.astype(np.float64), cache[name, 0, None][0])
    return out


def distributions(m: int = 4096) -> dict:
    """One operand's NVFP4 SQNR rounded to nearest, without and with the transform
    (signs of seed 0), for (64, m) operands of iid values of a few distributions: what the
    transform does to an operand whatever GEMM it feeds."""
    rng = np.random.default_rng(0)
    draws = {
        "uniform": rng.uniform(-1, 1, (64, m)),
        "gaussian": rng.standard_normal((64, m)),
        "laplace": rng.laplace(size=(64, m)),
        "student_t3": rng.standard_t(3, (64, m)),
        "sparse_10pct": rng.standard_normal((64, m)) * (rng.random((64, m)) < 0.1),
    }
    scheme = lowp.NVFP4Scaling(16, global_scale=True)
    out = {}
    for name, t in draws.items():
        t = bf16(t)
        rht = hadamard.transform_numpy(_bits.ftz(t), hadamard.signs(0, "", (m,)))
        out[name] = {
            "crest": block_crest(t),
            "crest_rht": block_crest(rht),
            "sqnr": sqnr(t.astype(np.float64), operand(t, scheme, sign_seed=None, sr_seed=None)[0]),
            "sqnr_rht": sqnr(
                rht.astype(np.float64), operand(t, scheme, sign_seed=0, sr_seed=None)[0]
            ),
        }
    return out


def paired(row: dict, a: str, b: str) -> np.ndarray:
    return np.array(row[a]["sqnr_per_step"]) - np.array(row[b]["sqnr_per_step"])


def summarize(label: str, rows: list[dict]) -> str:
    """One table line: per-step SQNR mean ± std over draws (and layers), averaged SQNR,
    and the transform's paired gains with their standard errors."""
    cells = []
    for variant in VARIANTS:
        s = np.concatenate([r[variant]["sqnr_per_step"] for r in rows])
        cells.append(f"{s.mean():.2f} ± {s.std():.2f}")
    avg = [np.mean([r[v]["sqnr_averaged"] for r in rows]) for v in VARIANTS]
    gains = []
    for a, b in (("nvfp4", "nvfp4_no_rht"), ("nvfp4_no_sr", "nvfp4_plain")):
        # per draw, the mean over the rows (layers) of the paired difference
        d = np.mean([paired(r, a, b) for r in rows], axis=0)
        gains.append(f"{d.mean():+.2f} ± {d.std(ddof=1) / np.sqrt(len(d)):.2f}")
    crest = [
        np.mean([r["stats"][t][c] for r in rows])
        for t in ("g", "x")
        for c in ("crest", "crest_rht", "sqnr", "sqnr_rht")
    ]
    return (
        f"| {label} | "
        + " | ".join(cells)
        + " | "
        + " / ".join(f"{a:.2f}" for a in avg)
        + " | "
        + " | ".join(gains)
        + f" | {crest[0]:.2f} → {crest[1]:.2f} | {crest[4]:.2f} → {crest[5]:.2f}"
        + f" | {crest[2]:.2f} → {crest[3]:.2f} | {crest[6]:.2f} → {crest[7]:.2f} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument(
        "--loss",
        choices=("masked", "all"),
        default="masked",
        help="MiniLM's cross-entropy on the masked tokens only, or on every token",
    )
    parser.add_argument("--json", help="write every row here")
    parser.add_argument(
        "--distributions",
        action="store_true",
        help="only the single-operand SQNR of iid values of a few distributions (seconds)",
    )
    args = parser.parse_args(argv)
    if args.distributions:
        print("| values | amax/rms in 16 (→ after RHT) | SQNR, nearest (dB) (→ after RHT) |")
        print("|---|---|---|")
        for name, r in distributions().items():
            print(
                f"| {name} | {r['crest']:.2f} → {r['crest_rht']:.2f} "
                f"| {r['sqnr']:.2f} → {r['sqnr_rht']:.2f} |"
            )
        return 0
    start = time.time()
    rows = {}
    for name, g, x in minilm_operands(args.batch, args.seq, args.loss):
        rows[f"minilm.{name}"] = measure(g, x, args.draws)
        print(f"{name} done, {time.time() - start:.0f} s", flush=True)
    m = args.batch * args.seq
    for kind in SYNTHETIC:
        rows[kind] = measure(*synthetic_operands(kind, m), args.draws)
    print(f"\nM = {m} tokens, {args.draws} draws; SQNR in dB; per step: mean ± std over draws")
    print(
        "| operands | " + " | ".join(f"`{v}` per step" for v in VARIANTS) + " | averaged "
        "(" + " / ".join(VARIANTS) + ") | RHT gain with SR | RHT gain, nearest "
        "| g amax/rms in 16 (→ after RHT) | x amax/rms | g SQNR, nearest (→ after RHT) "
        "| x SQNR |"
    )
    print("|---" * 12 + "|")
    for kind in KINDS:
        print(summarize(f"MiniLM {kind}", [r for k, r in rows.items() if k.endswith(kind)]))
    print(summarize("MiniLM all 36", [r for k, r in rows.items() if k.startswith("minilm")]))
    for kind in SYNTHETIC:
        print(summarize(kind, [rows[kind]]))
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"args": vars(args), "variants": VARIANTS, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
