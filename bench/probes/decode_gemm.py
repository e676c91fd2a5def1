"""The skinny decode GEMM prototype (`lowp_torch._triton_decode`) against torch._scaled_mm
and bf16 `F.linear` at decode sizes, on a GPU: issue 22 item 3's first bullet.

For Llama-3-8B's projections (K, N) and M tokens, times (CUDA events, `_timing`, all
variants of a row interleaved):

    bf16        F.linear(x, w) in bfloat16
    scaled_mm   torch._scaled_mm of the fp8 codes (the GEMM lowp's planned call runs)
    skinny      _triton_decode.skinny_scaled_mm of the same operands

for the float8_tensorwise and float8_rowwise scheme pairs (the activation already
quantized: the GEMMs alone), and checks skinny's output against spec §7's bound.
Prints one line a row, µs each; `--json` writes them.

    python bench/probes/decode_gemm.py                 # on the H200
    python bench/probes/decode_gemm.py --m 1 16 --json decode.json
"""

import argparse
import json
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_torch
from bench import _timing
from lowp_torch import _gemm, _triton_decode

SHAPES = {"qo": (4096, 4096), "kv": (4096, 1024), "w1w3": (4096, 14336), "w2": (14336, 4096)}
SCHEMES = {"tensorwise": lowp.TensorScaling(), "rowwise": lowp.AxisScaling()}


def row(m: int, k: int, n: int, scheme, timing) -> dict:
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    a, b = lowp_torch.quantize(x, scheme), lowp_torch.quantize(w, scheme)
    form = _gemm.gemm_form(a, b)
    a_codes, a_scale = _gemm.a_operand(a, form)
    b_codes, b_scale = _gemm.b_operand(b, form)
    b_t = b_codes.t()
    calls = {
        "bf16": lambda: F.linear(x, w),
        "scaled_mm": lambda: torch._scaled_mm(
            a_codes, b_t, scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16
        ),
        "skinny": lambda: _triton_decode.skinny_scaled_mm(a, b, out_dtype=torch.bfloat16),
    }
    measured = _timing.time_interleaved(list(calls.values()), _timing.torch_sync(torch.device("cuda")), timing)
    y = calls["skinny"]().double()
    exact = a.dequantize(torch.float32).double() @ b.dequantize(torch.float32).double().T
    sqnr = float(20 * torch.log10(exact.norm() / (y - exact).norm()))
    result = {name: round(r.ms * 1e3, 2) for name, r in zip(calls, measured, strict=True)}
    return {"m": m, "k": k, "n": n, **result, "skinny_sqnr_db": round(sqnr, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    timing = _timing.Timing()
    rows = []
    for scheme_name, scheme in SCHEMES.items():
        for shape_name, (k, n) in SHAPES.items():
            for m in args.m:
                r = {"scheme": scheme_name, "shape": shape_name, **row(m, k, n, scheme, timing)}
                print(r, flush=True)
                rows.append(r)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
