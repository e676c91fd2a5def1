"""Does torch.compile change a byte of a quantized Hugging Face BERT, and where do its
compiled and eager outputs part? Where does the compile time go? (issue 21, item 4)

    PYTHONPATH=. python bench/probes/compiled_hf.py --layers 6 --preset float8_rowwise
    PYTHONPATH=. python bench/probes/compiled_hf.py --layers 6 --preset float8_rowwise --nudge
    PYTHONPATH=. python bench/probes/compiled_hf.py --layers 1 --preset float --out stats.json

The model is all-MiniLM-L6-v2's BertModel (transformers, the MiniLM package's files)
truncated to its first --layers encoder layers, quantized with `lowp_torch.quantize_`
(--preset float leaves it float), on two sentences.

Each quantized Linear is wrapped by `Recorded`: it quantizes its input with the layer's
activation scheme where Dynamo sees it, then calls `F.linear` on the quantized input,
which is the route a `quantize_`d layer takes after its own quantize step; it records
the input, the codes, the scales and the output of every call. (In a `quantize_`d
layer the quantize step runs inside QuantizedTensor's __torch_function__, which
AOTAutograd traces, so its codes cannot be returned from the compiled graph.) The same
aten operations reach Inductor either way.

Printed per Linear: how far the compiled model's input to it is from eager's input,
and whether eager `lowp_torch.quantize` of the compiled model's input gives the
compiled codes and scales byte for byte. Then the last hidden state, compiled against
eager, and the first compiled call: its wall time, the CPU time of this process (Dynamo,
AOTAutograd, Inductor's lowering and C++ code generation) and of its children (the C++
compiler; Inductor is told to compile in this process, `compile_threads = 1`, so they
are its children), and the kernels Inductor generated.

With --nudge there is no compile: eager against eager with the embedding output moved
up one float32 ulp in about half its elements (a fixed seed), and each Linear's input
codes that moved.
"""

import argparse
import copy
import json
import os
import pathlib
import resource
import sys
import tempfile
import time
import unittest.mock
from typing import NamedTuple

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import lowp_torch
from lowp_apps import minilm
from lowp_torch import _qtensor

SENTENCES = ("A man is playing a guitar.", "The train to Paris was delayed by an hour.")


def small_bert(layers: int) -> torch.nn.Module:
    """MiniLM's BertModel with its first `layers` encoder layers and their weights."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(minilm.model_dir()))
    config.num_hidden_layers = layers
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the dropped layers' weights are "unexpected"
    try:
        model = transformers.AutoModel.from_pretrained(str(minilm.model_dir()), config=config)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return model.eval()


def batch() -> dict:
    """input_ids and attention_mask of the two sentences (12 tokens, one padded)."""
    encoding = minilm.Tokenizer.from_pretrained()(list(SENTENCES))
    return {
        "input_ids": torch.as_tensor(encoding.input_ids),
        "attention_mask": torch.as_tensor(encoding.attention_mask),
    }


class Call(NamedTuple):
    """One call of a `Recorded` Linear: its input, the input's quantized parts, output."""

    layer: "Recorded"
    x: torch.Tensor
    codes: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None
    y: torch.Tensor


class Recorded(torch.nn.Module):
    """A `quantize_`d Linear that quantizes its input in the open and records each call."""

    def __init__(self, linear: torch.nn.Linear, name: str, calls: list):
        super().__init__()
        self.linear, self.name, self.calls = linear, name, calls
        self.activation = _qtensor.linear_of(linear.weight).activation
        if self.activation is None:
            raise ValueError(f"{name}: a weight-only layer has no activation to record")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = lowp_torch.quantize(x.reshape(-1, x.shape[-1]), self.activation)
        y = F.linear(a, self.linear.weight, self.linear.bias)
        y = y.reshape(tuple(x.shape[:-1]) + (y.shape[-1],))
        self.calls.append(Call(self, x, a.codes, a.scale, a.global_scale, y))
        return y


def record_linears(model: torch.nn.Module) -> list:
    """Wrap every quantized Linear of `model` in `Recorded`, in place; the list they fill."""
    calls: list = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                full = f"{parent_name}.{name}" if parent_name else name
                setattr(parent, name, Recorded(child, full, calls))
    return calls


def forward(model, inputs) -> torch.Tensor:
    with torch.inference_mode():
        return model(**inputs).last_hidden_state


def stored_bytes(t: torch.Tensor | None) -> torch.Tensor | None:
    """A stored tensor's bits: int32 for float32, uint8 for the one-byte dtypes."""
    if t is None:
        return None
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)


def same_bytes(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(stored_bytes(a), stored_bytes(b))


def eager_requantizes(call: Call) -> bool:
    """Whether eager `quantize` of the recorded input gives the recorded codes and scales."""
    with torch.inference_mode():
        q = lowp_torch.quantize(call.x.reshape(-1, call.x.shape[-1]), call.layer.activation)
    return all(
        same_bytes(mine, recorded)
        for mine, recorded in (
            (q.codes, call.codes),
            (q.scale, call.scale),
            (q.global_scale, call.global_scale),
        )
    )


def difference(a: torch.Tensor, b: torch.Tensor) -> dict:
    """max |a - b|, SQNR of b against a in dB, and how many float32 patterns differ."""
    error = (a.double() - b.double()).norm()
    return {
        "max_abs": float((a - b).abs().max()),
        "sqnr_db": float("inf") if error == 0 else float(20 * torch.log10(a.norm() / error)),
        "differing": int((a.view(torch.int32) != b.view(torch.int32)).sum()),
        "elements": a.numel(),
    }


def first_call_costs(compiled, inputs) -> dict:
    """Wall and CPU seconds of the first compiled call, and Inductor's kernel counts."""
    from torch._inductor import metrics

    metrics.reset()
    wall, cpu = time.perf_counter(), time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = forward(compiled, inputs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "out": out,
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
        "compiler_cpu_s": round(
            after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime, 1
        ),
        "kernels": metrics.generated_kernel_count,
        "ir_nodes_pre_fusion": metrics.ir_nodes_pre_fusion,
    }


def quantized(model: torch.nn.Module, preset: str, record: bool) -> tuple:
    """`model` quantized with `preset` ("float": left float), its Linears `Recorded` if
    `record`; and the list of their calls (empty if nothing is recorded)."""
    if preset == "float":
        return model, []
    lowp_torch.quantize_(model, preset)
    return model, record_linears(model) if record else []


def compare_compiled(layers: int, preset: str, unwrapped: bool = False) -> dict:
    """Eager against compiled, per Linear and at the last hidden state. `unwrapped`:
    the `quantize_`d layers as they are, nothing recorded (the last hidden state and
    the compile only)."""
    import torch._inductor.config as inductor_config

    model, calls = quantized(small_bert(layers), preset, record=not unwrapped)
    inputs = batch()
    eager = forward(model, inputs)
    eager_calls = list(calls)
    calls.clear()
    torch._dynamo.reset()
    inductor_config.compile_threads = 1  # the C++ compiler runs as this process's child
    cache = tempfile.mkdtemp(prefix="lowp_inductor_")  # a cold Inductor cache, left for reading
    with unittest.mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):
        costs = first_call_costs(torch.compile(model, fullgraph=True), inputs)
    compiled = costs.pop("out")
    linears = [
        {
            "linear": c.layer.name,
            "input": difference(e.x, c.x),
            "same_input_same_bytes": eager_requantizes(c),
        }
        for e, c in zip(eager_calls, calls, strict=True)
    ]
    return {
        "layers": layers,
        "preset": preset,
        "unwrapped": unwrapped,
        "torch": torch.__version__,
        "linears": linears,
        "last_hidden_state": difference(eager, compiled),
        "first_call": costs,
    }


def nudged(layers: int, preset: str, seed: int = 0) -> dict:
    """Eager against eager with the embedding output one ulp up in about half its elements."""
    float_model, inputs = small_bert(layers), batch()
    model, calls = quantized(copy.deepcopy(float_model), preset, record=True)
    plain = forward(model, inputs)
    plain_calls = list(calls)
    calls.clear()
    gen = torch.Generator().manual_seed(seed)

    def nudge(module, args, out):
        up = torch.nextafter(out, torch.full_like(out, float("inf")))
        return torch.where(torch.rand(out.shape, generator=gen) < 0.5, up, out)

    model.embeddings.register_forward_hook(nudge)
    moved = forward(model, inputs)
    linears = [
        {
            "linear": a.layer.name,
            "input": difference(a.x, b.x),
            "codes_moved": int((stored_bytes(a.codes) != stored_bytes(b.codes)).sum()),
        }
        for a, b in zip(plain_calls, calls, strict=True)
    ]
    return {
        "layers": layers,
        "preset": preset,
        "seed": seed,
        "linears": linears,
        "last_hidden_state": difference(plain, moved),
        "quantized_vs_float": difference(forward(float_model, inputs), plain),
    }


def _line(d: dict) -> str:
    return (
        f"max|d| {d['max_abs']:.3g}  {d['sqnr_db']:.1f} dB  {d['differing']}/{d['elements']} differ"
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=1, help="encoder layers kept (1-6)")
    parser.add_argument("--preset", default="float8_rowwise", help="an inference preset, or float")
    parser.add_argument("--nudge", action="store_true", help="eager against a 1-ulp nudge")
    parser.add_argument(
        "--unwrapped", action="store_true", help="compile the quantize_d layers as they are"
    )
    parser.add_argument("--out", type=pathlib.Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.layers <= 6:
        parser.error(f"--layers must be 1 to 6 (MiniLM has 6), got {args.layers}")
    if args.nudge:
        result = nudged(args.layers, args.preset)
    else:
        result = compare_compiled(args.layers, args.preset, args.unwrapped)
    for row in result["linears"]:
        verdict = (
            f"codes moved {row['codes_moved']}"
            if args.nudge
            else f"same input -> same bytes: {row['same_input_same_bytes']}"
        )
        print(f"{row['linear']:40s} input {_line(row['input'])} | {verdict}")
    print("last hidden state:", _line(result["last_hidden_state"]))
    for key in ("quantized_vs_float", "first_call"):
        if key in result:
            print(f"{key}:", result[key] if key == "first_call" else _line(result[key]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
