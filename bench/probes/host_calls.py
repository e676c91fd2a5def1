"""What an eager quantized linear costs the host per call: µs, aten ops, Python calls.

Issue 22 item 3: on the H200 a `quantize_`'d inference linear added ~0.36 ms of host time
at one token and an fp8 training linear ~2 ms per forward + backward. At tiny shapes
(M = 1..16, K = N = 64, the default) the kernels' own time is negligible, so a call's wall time on
a CPU is its Python and dispatcher time, which this measures for each variant against
`F.linear` (inference) or nn.Linear's forward + backward (training):

    us        µs per call (forward, or forward + backward for training rows): the
              fastest of --repeats batches of --calls calls, each batch's mean
    ops       aten ops per call, counted by a TorchDispatchMode (for training: forward
              and backward apart). On CUDA each costs a dispatch and, mostly, a kernel
              launch (~5-10 µs of host time each), so it is the lever there
    triton    Triton kernel launches per call (the fused casts), each another launch
    py calls  Python function calls per call (cProfile's count)

`--path cuda` (the default) runs the Python path lowp takes on an sm_90 GPU, on the CPU:
the fp8 GEMM kernel check is answered as on CUDA (`torch._scaled_mm` for tensorwise and
rowwise fp8), and `quantize` takes the Triton-cast
branch, whose launches are replaced by their allocations (the same `torch.empty` /
`torch.zeros` the real launcher makes) and counted, and `torch._scaled_mm` by the
allocation of its output (one op, as cuBLAS's one launch: the CPU's fp8 GEMM takes
milliseconds, which are not host time). The bytes are then not lowp's
(nothing is cast): this measures the host path only. `--path cpu` runs the real CPU
path (torch-ops casts, emulated GEMM), with its real ops.

Training layers run with `small_shapes="quantize"` (the fp8 path, which the issue's
4096³ measurement took); the small-shape fallback is `host_overhead.py`'s subject.

    python bench/probes/host_calls.py                         # CUDA's path, on this CPU
    python bench/probes/host_calls.py --path cpu --m 1 16     # the CPU path
    python bench/probes/host_calls.py --json out.json         # and the rows as JSON

On a GPU host, `--device cuda` runs the real path: µs is then the host's time per call
(the launches are asynchronous and nothing synchronizes; at these shapes the GPU keeps
up), ops the aten ops, and the triton column stays 0 (real launches are not counted).
"""

import argparse
import contextlib
import cProfile
import json
import pathlib
import pstats
import sys
import time
import unittest.mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp
import lowp_torch
from lowp_torch import _cast_kernels, _gemm

INFER_PRESETS = ("float8_rowwise", "float8_tensorwise")
TRAIN_RECIPES = ("float8_tensorwise", "float8_rowwise")


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside the block (`ops`), and which (`names`)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.names: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.name()
        self.names[name] = self.names.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


LAUNCHES = [0]  # Triton launches the faked cast branch stood in for


@contextlib.contextmanager
def cuda_path():
    """The Python path of an sm_90 GPU on CPU tensors (module docstring)."""
    from lowp_torch import _triton_casts

    real_problem = _gemm.kernel_problem

    def scaled_mm(a, b, *, scale_a, scale_b, bias=None, out_dtype, use_fast_accum=False):
        # one op, as cuBLAS's one launch (the CPU's fp8 GEMM takes ms: not host time)
        return torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)

    def kernel_problem(kernel, a, b, form, out_dtype):
        if kernel == "scaled_mm" and form in ("tensorwise", "rowwise") and a.dim() == b.dim() == 2:
            return None
        return real_problem(kernel, a, b, form, out_dtype)

    real_triton_problem = _cast_kernels.triton_problem

    def triton_problem(t, scheme, *args, **kwargs):  # a CPU tensor taken for a CUDA one
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = torch.empty(t.shape, dtype=t.dtype, device="meta")
            problem = real_triton_problem(t, scheme, *args, **kwargs)
            return None if problem == "the input is on meta, not CUDA" else problem
        return real_triton_problem(t, scheme, *args, **kwargs)

    def launch(x, shape, scheme, fmt):  # `_triton_casts._tensor` / `_axis_rows`' allocations
        codes = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)  # no subnormals
        if isinstance(scheme, lowp.TensorScaling):
            torch.zeros(1, dtype=torch.int32, device=x.device)  # the amax
            LAUNCHES[0] += 2
            return codes, torch.ones((), dtype=torch.float32, device=x.device)
        LAUNCHES[0] += 1
        return codes, torch.ones(shape[0], dtype=torch.float32, device=x.device)

    def launch_both(x, scheme, fmt):  # `_tensor_both`, `_axis_2d(..., cols_t=True)`
        r, c = x.shape
        if isinstance(scheme, lowp.TensorScaling):
            torch.zeros(1, dtype=torch.int32, device=x.device)  # the amax
            scales = torch.ones(()), torch.ones(())
        else:
            for n in (r, c):
                torch.zeros(n, dtype=torch.int32, device=x.device)
            scales = torch.ones(r), torch.ones(c)
        LAUNCHES[0] += 2
        return (
            (torch.zeros(x.shape, dtype=torch.uint8), scales[0]),
            (torch.zeros((c, r), dtype=torch.uint8), scales[1]),
        )

    fakes = (
        (_gemm, "kernel_problem", kernel_problem),
        (_gemm, "_cuda_capability", lambda index: (9, 0)),
        (_cast_kernels, "triton_problem", triton_problem),
        (_triton_casts, "_launch", launch),
        (_triton_casts, "_launch_both", launch_both),
        (torch, "_scaled_mm", scaled_mm),
    )
    with contextlib.ExitStack() as stack:
        for module, name, fake in fakes:
            stack.enter_context(unittest.mock.patch.object(module, name, fake))
        yield


def time_us(call, calls: int, repeats: int) -> float:
    """µs per call: the fastest of `repeats` batches of `calls` calls, each batch's mean.
    The fastest batch, not a median: on a shared CPU the others are the neighbours'."""
    for _ in range(20):
        call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def count(call, setup=lambda: None) -> tuple[int, int, dict]:
    """(aten ops, Triton launches, {op: count}) of one `call(setup())`, after one not
    counted (a layer's first call decides what the next ones keep); `setup` runs
    outside the count."""
    call(setup())
    arg = setup()
    LAUNCHES[0] = 0
    with OpCounter() as counter:
        call(arg)
    return counter.ops, LAUNCHES[0], counter.names


def python_calls(call) -> int:
    profile = cProfile.Profile()
    profile.enable()
    call()
    profile.disable()
    return pstats.Stats(profile).total_calls  # type: ignore[attr-defined]


def infer_rows(m: int, k: int, dtype, device, args) -> list[dict]:
    """F.linear against each quantize_'d preset, forward under inference_mode."""
    base = torch.nn.Linear(k, k, device=device, dtype=dtype)
    x = torch.randn(m, k, device=device, dtype=dtype)
    layers = {"F.linear": base}
    for preset in INFER_PRESETS:
        layer = torch.nn.Linear(k, k, device=device, dtype=dtype)
        layer.load_state_dict(base.state_dict())
        layers[preset] = lowp_torch.quantize_(layer, preset)
    rows = []
    with torch.inference_mode():
        for name, layer in layers.items():
            call = lambda layer=layer: layer(x)  # noqa: E731
            ops, launches, names = count(lambda _, call=call: call())
            rows.append(
                {
                    "kind": "infer",
                    "variant": name,
                    "m": m,
                    "k": k,
                    "us": round(time_us(call, args.calls, args.repeats), 1),
                    "ops": ops,
                    "triton": launches,
                    "py_calls": python_calls(call),
                    "op_names": names,
                }
            )
    return rows


def train_rows(m: int, k: int, dtype, device, args) -> list[dict]:
    """nn.Linear against each recipe's lowp_torch.Linear, forward + backward."""
    base = torch.nn.Linear(k, k, device=device, dtype=dtype)
    x = torch.randn(m, k, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn(m, k, device=device, dtype=dtype)
    layers = {"nn.Linear": base}
    for recipe in TRAIN_RECIPES:
        layers[recipe] = lowp_torch.Linear.from_float(base, recipe, small_shapes="quantize")
    rows = []
    for name, layer in layers.items():

        def forward(layer=layer):
            return layer(x)

        def step(layer=layer):
            layer(x).backward(dy)

        fwd_ops, fwd_launches, fwd_names = count(lambda _, f=forward: f())
        bwd_ops, bwd_launches, bwd_names = count(lambda y: y.backward(dy), forward)
        rows.append(
            {
                "kind": "train",
                "variant": name,
                "m": m,
                "k": k,
                "us": round(time_us(step, args.calls, args.repeats), 1),
                "ops": fwd_ops + bwd_ops,
                "ops_fwd": fwd_ops,
                "ops_bwd": bwd_ops,
                "triton": fwd_launches + bwd_launches,
                "py_calls": python_calls(step),
                "op_names": {"forward": fwd_names, "backward": bwd_names},
            }
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--train-m", type=int, nargs="+", default=[16])
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--kinds", nargs="+", default=["infer", "train"])
    parser.add_argument("--ops", action="store_true", help="list each variant's aten ops")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    fake = args.path == "cuda" and device.type == "cpu"
    rows = []
    with cuda_path() if fake else contextlib.nullcontext():
        if "infer" in args.kinds:
            for m in args.m:
                rows += infer_rows(m, args.k, torch.bfloat16, device, args)
        if "train" in args.kinds:  # M = 1 would run the wgrad emulated (K = M % 16 != 0)
            for m in args.train_m:
                rows += train_rows(m, args.k, torch.bfloat16, device, args)
    print(f"path={args.path} device={device} K=N={args.k} bfloat16, torch {torch.__version__}")
    print(f"{'kind':6} {'variant':18} {'M':>4} {'us':>8} {'ops':>9} {'triton':>6} {'py calls':>8}")
    for r in rows:
        ops = r["ops"] if r["kind"] == "infer" else f"{r['ops_fwd']}+{r['ops_bwd']}"
        print(
            f"{r['kind']:6} {r['variant']:18} {r['m']:>4} {r['us']:>8.1f} {ops:>9} "
            f"{r['triton']:>6} {r['py_calls']:>8}"
        )
        if args.ops:
            print(f"       {r['op_names']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
