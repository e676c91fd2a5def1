"""The decode kernel (`lowp_torch._triton_decode`) in the quantized linear's eager call,
against bf16 `F.linear` and the planned `torch._scaled_mm` call, on a GPU: issue 22
item 3.

For Llama-3-8B's projections (K, N), M tokens and both presets' scheme pairs, three
calls of the same layer:

    bf16        F.linear(x, w) in bfloat16
    scaled_mm   the quantize_'d layer's planned call with the decode kernel switched
                off: the Triton activation cast, then torch._scaled_mm
    decode      the quantize_'d layer's default call: the decode kernel for
                M <= MAX_M (one launch), else the same as scaled_mm

each timed three ways, in µs a call: `wall` (a loop of calls and a sync, interleaved
with the other two: host and device together, `bench/_timing`), `device` (the calls
replayed from a CUDA graph, `triton.testing.do_bench_cudagraph`: the GPU's time alone)
and `host` (the loop's time before its sync: what the host spends issuing a call). The
decode output's SQNR against the float64 product of the dequantized operands is
checked (spec §7: >= 40 dB). One line a row; `--json` writes them.

`--sweep` instead times the decode kernel alone (`device`, CUDA graph) over the
configurations given by --block-n, --block-k, --split-k, --warps, --dot (the Cartesian
product; M > 1 takes only tensor-core ones), and prints each row's fastest.

    python bench/probes/decode_gemm.py
    python bench/probes/decode_gemm.py --m 1 16 --shapes kv w2 --json decode.json
    python bench/probes/decode_gemm.py --sweep --m 1 --block-n 16 32 --block-k 128 256 512
"""

import argparse
import copy
import dataclasses
import itertools
import json
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp_torch
from bench import _timing

SHAPES = {"qo": (4096, 4096), "kv": (4096, 1024), "w1w3": (4096, 14336), "w2": (14336, 4096)}
PRESETS = {"tensorwise": "float8_tensorwise", "rowwise": "float8_rowwise"}
DEVICE = torch.device("cuda")


def device_us(fn) -> float:
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3


def host_us(fn, calls: int = 200) -> float:
    torch.cuda.synchronize(DEVICE)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    issued = time.perf_counter() - start
    torch.cuda.synchronize(DEVICE)
    return issued / calls * 1e6


def _layers(k: int, n: int, preset: str):
    """(bf16 Linear, its quantize_'d copy, another copy whose plan has no decode)."""
    torch.manual_seed(0)
    bf16 = torch.nn.Linear(k, n, bias=False, device=DEVICE, dtype=torch.bfloat16)
    quantized = lowp_torch.quantize_(copy.deepcopy(bf16), preset)
    planned = lowp_torch.quantize_(copy.deepcopy(bf16), preset)
    with torch.inference_mode():
        planned(torch.randn(1, k, device=DEVICE, dtype=torch.bfloat16))  # makes the plan
    for plan in planned.weight.__dict__["_lowp_plans"].values():
        plan.decode = None
    return bf16, quantized, planned


def _sqnr_db(y, layer, x) -> float:
    a = lowp_torch.quantize(x, layer.weight.linear.activation)
    exact = a.dequantize(torch.float32).double() @ layer.weight.dequantize(torch.float32).double().T
    return float(20 * torch.log10(exact.norm() / (y.double() - exact).norm()))


def row(m: int, k: int, n: int, preset: str, timing) -> dict:
    bf16, quantized, planned = _layers(k, n, preset)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    calls = {
        "bf16": lambda: F.linear(x, bf16.weight),
        "scaled_mm": lambda: planned(x),
        "decode": lambda: quantized(x),
    }
    result = {}
    with torch.inference_mode():
        for fn in calls.values():
            fn()
            fn()  # plans, then binds
        walls = _timing.time_interleaved(list(calls.values()), _timing.torch_sync(DEVICE), timing)
        for (name, fn), wall in zip(calls.items(), walls, strict=True):
            result[name] = {
                "wall": round(wall.ms * 1e3, 1),
                "device": round(device_us(fn), 1),
                "host": round(host_us(fn), 1),
            }
        sqnr = _sqnr_db(calls["decode"](), quantized, x)
    speedup = result["bf16"]["wall"] / result["decode"]["wall"]
    return {
        "m": m,
        "k": k,
        "n": n,
        **result,
        "decode_sqnr_db": round(sqnr, 1),
        "decode_speedup_wall": round(speedup, 2),
    }


def sweep(m: int, k: int, n: int, preset: str, args) -> dict:
    from lowp_torch import _triton_decode as D

    _, quantized, _ = _layers(k, n, preset)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    with torch.inference_mode():
        quantized(x)
        y_default = quantized(x)
    (plan,) = quantized.weight.__dict__["_lowp_plans"].values()
    decode, codes, scale = plan.decode, plan.decode_codes, plan.decode_scale
    default = D.default_config(m, n, k, decode.programs)
    timed = {}
    grid = itertools.product(args.block_n, args.block_k, args.split_k, args.warps, args.dot)
    for block_n, block_k, split_k, warps, dot in grid:
        if (m > 1 and not dot) or split_k > max(1, k // block_k):
            continue
        try:
            config = D.Config(block_n, block_k, split_k, warps, bool(dot))
            with torch.inference_mode():
                y = decode(x, codes, scale, config=config)
                sqnr = _sqnr_db(y, quantized, x)
                us = device_us(lambda config=config: decode(x, codes, scale, config=config))
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit: reported
            print(f"  {block_n},{block_k},{split_k},{warps},{dot}: {type(e).__name__}: {e}"[:200])
            continue
        if sqnr < 40:
            print(f"  {block_n},{block_k},{split_k},{warps},{dot}: SQNR {sqnr:.1f} dB < 40")
            continue
        timed[f"{block_n},{block_k},{split_k},{warps},{dot}"] = round(us, 1)
    with torch.inference_mode():
        default_us = device_us(lambda: quantized(x))
    best = min(timed, key=timed.get) if timed else None
    return {
        "m": m,
        "k": k,
        "n": n,
        "default": dataclasses.astuple(default)[:5],
        "default_us": round(default_us, 1),
        "default_sqnr_db": round(_sqnr_db(y_default, quantized, x), 1),
        "best": best,
        "best_us": timed.get(best),
        "all": timed,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--sweep", action="store_true", help="time decode configurations")
    parser.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--block-k", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--split-k", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--warps", type=int, nargs="+", default=[4])
    parser.add_argument("--dot", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    args = parser.parse_args()
    timing = _timing.Timing()
    rows = []
    for scheme_name in args.presets:
        for shape_name in args.shapes:
            k, n = SHAPES[shape_name]
            for m in args.m:
                if args.sweep:
                    r = sweep(m, k, n, PRESETS[scheme_name], args)
                else:
                    r = row(m, k, n, PRESETS[scheme_name], timing)
                r = {"scheme": scheme_name, "shape": shape_name, **r}
                print({key: v for key, v in r.items() if key != "all"}, flush=True)
                rows.append(r)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
