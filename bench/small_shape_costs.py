"""The small-shape policy's constants: what a training layer's fp8 casts and GEMMs cost.

    python bench/small_shape_costs.py --out costs.json     # on the GPU (bash .ci/gpu small-shape-costs)
    python bench/small_shape_costs.py --small              # CPU smoke run: the plumbing

For each float8 recipe, a bias-free Linear's forward + backward is timed eagerly with the
recipe forced (`small_shapes="quantize"`) beside the same layer in bf16, interleaved per
shape, over token counts M = 256 ... 16384 and the (K, N) of Llama-3-8B's projections. Then
the measurements are set beside `lowp._small_shapes`' cost model: each variant's host
floor (its fastest call: the device's work shorter than the launches), its rate at the
largest shapes (6·M·K·N flops a call, casts included), and, per recipe and shape, the
model's predicted times and whether its decision (fp8 or high precision) is the faster
one measured. The constants in `lowp._small_shapes.COSTS` come from such a run.
"""

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import lowp_torch
from bench import _timing, linear_step
from lowp import _small_shapes

RECIPES = ("float8_tensorwise", "float8_rowwise", "float8_rowwise_gw_hp")
TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384)
# Llama-3-8B: q/o (4096, 4096), k/v (4096 -> 1024), w1/w3 (4096 -> 14336), w2 (14336 -> 4096)
WEIGHTS = ((4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096))
SMALL_TOKENS = (16, 32)
SMALL_WEIGHTS = ((64, 32), (32, 64))


def measure(m, k, n, device, timing) -> dict:
    """ms per forward + backward: bf16 and each recipe forced to fp8, interleaved."""
    x, weight, dy = linear_step.inputs(m, k, n, device)
    layers = [linear_step.make_layer("bf16", None, weight)]
    for recipe in RECIPES:
        layer = linear_step.make_layer("bf16", None, weight)
        layers.append(lowp_torch.convert_to_training(layer, recipe, small_shapes="quantize"))
    calls = [linear_step.fwd_bwd(layer, x, dy) for layer in layers]
    measured = _timing.time_interleaved(calls, _timing.torch_sync(device), timing)
    return {
        "M": m,
        "K": k,
        "N": n,
        "ms": dict(zip(("bf16", *RECIPES), (round(r.ms, 4) for r in measured), strict=True)),
    }


def check(rows: list[dict]) -> dict:
    """Each variant's host floor and large-shape rate, and the policy's decisions set
    against the measured times."""
    facts = {}
    largest = max(r["M"] * r["K"] * r["N"] for r in rows)
    for variant in ("bf16", *RECIPES):
        times = [r["ms"][variant] for r in rows]
        big = [r for r in rows if r["M"] * r["K"] * r["N"] == largest]
        facts[variant] = {
            "host_floor_ms": min(times),
            "tflops_at_largest": round(
                max(6 * r["M"] * r["K"] * r["N"] / (r["ms"][variant] * 1e9) for r in big), 1
            ),
        }
    decisions, agree = [], 0
    for r in rows:
        m, k, n = r["M"], r["K"], r["N"]
        for recipe in RECIPES:
            c = _small_shapes.costs(recipe)
            predicted_fp8 = _small_shapes.call_pays(m, k, n, recipe)
            measured_fp8 = r["ms"][recipe] < r["ms"]["bf16"]
            agree += predicted_fp8 == measured_fp8
            decisions.append(
                {
                    "shape": f"{m}x{k}x{n}",
                    "recipe": recipe,
                    "predicted_ms": [round(c.fp8_ms(m, k, n), 3), round(c.bf16_ms(m, k, n), 3)],
                    "measured_ms": [r["ms"][recipe], r["ms"]["bf16"]],
                    "policy": "fp8" if predicted_fp8 else "high precision",
                    "right": predicted_fp8 == measured_fp8,
                }
            )
    return {"facts": facts, "agree": f"{agree} of {len(decisions)}", "decisions": decisions}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=None)
    p.add_argument("--small", action="store_true", help="tiny CPU shapes: checks the plumbing")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.small else "cuda")
    tokens, weights = (SMALL_TOKENS, SMALL_WEIGHTS) if args.small else (TOKENS, WEIGHTS)
    timing = (
        _timing.Timing(warmup=1, repeats=1, target_s=0.0)
        if args.small
        else _timing.Timing(warmup=3, repeats=7, target_s=0.03)
    )
    rows = []
    for k, n in weights:
        for m in tokens:
            row = measure(m, k, n, device, timing)
            rows.append(row)
            print(f"{m:>6}x{k}x{n}: " + "  ".join(f"{v}={t:.4f}" for v, t in row["ms"].items()))
    checked = check(rows)
    for name, c in checked["facts"].items():
        print(f"{name}: " + ", ".join(f"{key}={value:.4g}" for key, value in c.items()))
    for d in checked["decisions"]:
        if not d["right"]:
            print(f"policy wrong at {d['shape']} {d['recipe']}: {d}")
    print(f"the policy's decision is the faster one measured in {checked['agree']}")
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": rows,
        **checked,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
