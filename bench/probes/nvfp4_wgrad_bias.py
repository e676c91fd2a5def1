"""What do NVFP4's random Hadamard transform and stochastic rounding do to the weight
gradient? The wgrad `dw = g.T @ x` of `nvfp4` and its ablation variants
(`lowp.Recipe.ablation_names()`) against the exact one, over many stochastic draws.

    python -m bench.probes.nvfp4_wgrad_bias [--draws 64] [--m 1024] [--n 128] [--k 128]

Each variant's two wgrad operands are made as its `OperandPlan`s say (the transform with
the recipe's signs, seed 0, where `hadamard`; then `lowp.quantize` with the operand's
scheme and rounding), dequantized, and multiplied in float64. g and x hold bf16 values
(as the layers see them); the reference `g.T @ x` is exact in float64. The signs stay
those of seed 0 for every draw, as they stay in training; draw s takes stochastic
rounding's bits from seed s (the recipe's seed picks the bits the same way; here
only the bits change). Per variant it prints:

  SQNR/draw   mean over draws of 10 log10(|dw|^2 / |dw_q - dw|^2), one step's quality
  SQNR/mean   the same for the mean of dw_q over the draws: what averaging over steps
              leaves, the bias. Round-to-nearest has no draws (the two columns are
              equal); an unbiased operand gains about 10 log10(draws) dB here until the
              other operand's (nearest) rounding error is all that is left
  g bias      |mean_s deq(a_s) - a| / |a| for the gradient operand a (g.T, transformed
              where the variant transforms): SR makes it unbiased, so it falls as
              1/sqrt(draws); round-to-nearest keeps its error

for three kinds of data: Gaussian; Gaussian with outlier tokens (1 token in 64 of g and
of x scaled by 30: one spike in a block of 16); and heavy-tailed (Student's t, 3 degrees
of freedom: large values anywhere, the tails the transform makes Gaussian).
"""

import argparse

import ml_dtypes
import numpy as np

import lowp
from lowp import _hadamard as hadamard
from lowp.extend import LinearPlan

VARIANTS = ("nvfp4", "nvfp4_no_rht", "nvfp4_no_sr", "nvfp4_plain")
KINDS = ("gaussian", "outliers", "heavy")


def operands(kind: str, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(g (m, n), x (m, k)) as float32 holding bf16 values."""
    rng = np.random.default_rng(0)
    g, x = rng.standard_normal((m, n)), rng.standard_normal((m, k))
    if kind == "outliers":
        g[::64] *= 30
        x[32::64] *= 30
    elif kind == "heavy":
        g, x = rng.standard_t(3, (m, n)), rng.standard_t(3, (m, k))
    elif kind != "gaussian":
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return (
        g.astype(ml_dtypes.bfloat16).astype(np.float32),
        x.astype(ml_dtypes.bfloat16).astype(np.float32),
    )


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref**2) / np.sum((got - ref) ** 2)))


def operand(op, t: np.ndarray, seed: int) -> np.ndarray:
    """`op`'s operand of `t` (as the GEMM reads it), dequantized to float64, its stochastic
    bits (if any) drawn from `seed`; and the exact value it estimates (`t`, transformed
    where `op.hadamard`)."""
    t = np.ascontiguousarray(t, np.float32)
    if op.hadamard:
        t = hadamard.transform_numpy(t, op.signs(t.shape[-1]))
    kwargs = {"rounding": "stochastic", "seed": seed} if op.rounding == "stochastic" else {}
    q = lowp.dequantize(lowp.quantize(t, op.scheme, **kwargs))
    return np.asarray(q, np.float64), t.astype(np.float64)


def measure(variant: str, g: np.ndarray, x: np.ndarray, draws: int) -> dict:
    plan = LinearPlan.of(lowp.Recipe.from_name(variant)).wgrad
    exact = g.T.astype(np.float64) @ x.astype(np.float64)
    b, _ = operand(plan.b, x.T, 0)  # nearest: the same every draw
    products, a_sum, per_draw = [], 0.0, []
    for seed in range(draws):
        a, a_exact = operand(plan.a, g.T, seed)
        products.append(a @ b.T)
        per_draw.append(sqnr(exact, products[-1]))
        a_sum = a_sum + a
    return {
        "sqnr_per_draw": float(np.mean(per_draw)),
        "sqnr_of_mean": sqnr(exact, np.mean(products, axis=0)),
        "g_bias": float(np.linalg.norm(a_sum / draws - a_exact) / np.linalg.norm(a_exact)),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=64)
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--n", type=int, default=128)
    parser.add_argument("--k", type=int, default=128)
    args = parser.parse_args(argv)
    print(f"M={args.m} N={args.n} K={args.k}, {args.draws} draws")
    print("| data | variant | SQNR/draw (dB) | SQNR of the mean (dB) | g bias |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        g, x = operands(kind, args.m, args.n, args.k)
        for variant in VARIANTS:
            row = measure(variant, g, x, args.draws)
            print(
                f"| {kind} | `{variant}` | {row['sqnr_per_draw']:.2f} | "
                f"{row['sqnr_of_mean']:.2f} | {row['g_bias']:.4f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
