"""lowp demo: the same bytes in PyTorch and JAX, shown on a real model in about a
minute on a CPU.

all-MiniLM-L6-v2 is quantized with each preset in PyTorch and in JAX; the demo checks
that the 36 quantized linear weights are the same bytes in both frameworks and in the
NumPy reference, measures each framework's embedding fidelity against its unquantized
model (cosine over the built-in sentences, and whether every paraphrase pair still
scores above every unrelated pair), writes each PyTorch-quantized model to a lowp file
and loads it into the JAX twin (the same bytes, the same embeddings), and draws a
one-page PNG. Exit status 0: every byte check passed (weights, file, and the loaded
model's embeddings bit for bit); 1: one failed; 2: the demo could not run (a missing
package, a bad option), said plainly, with the pip command where one helps.

The CLI wires `add_arguments` and `run` as the `demo` subcommand.
"""

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
import time

import numpy as np

import lowp
from lowp_apps import demo_frameworks as frameworks
from lowp_apps import demo_report, minilm

DEFAULT_PRESETS = ("float8_rowwise", "mxfp8", "nvfp4")

# What the demo imports, and the pip command that provides it.
_REQUIREMENTS = (
    (
        "torch",
        "PyTorch",
        (
            "pip install 'lowp[torch]' (CPU-only build: pip install torch "
            "--index-url https://download.pytorch.org/whl/cpu)"
        ),
    ),
    ("jax", "JAX", "pip install 'lowp[jax]'"),
    ("flax", "flax", "pip install 'lowp[jax]'"),
)
_NO_MATPLOTLIB = "matplotlib is not installed: pip install 'lowp[plot]' (or pip install matplotlib)"


class _CannotRun(Exception):
    """The demo cannot run here (missing package, device, bad option): exit code 2."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    presets = ", ".join(lowp.InferenceConfig.names())
    parser.add_argument(
        "--presets",
        default=",".join(DEFAULT_PRESETS),
        help=f"comma-separated inference presets, or 'all' ({presets}); "
        f"default {','.join(DEFAULT_PRESETS)}",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="auto: each framework's GPU where it sees one, else the CPU (default); "
        "cpu: force the CPU; gpu: fail unless both frameworks see a GPU",
    )
    parser.add_argument(
        "--png", default="lowp_demo.png", help="the one-page summary (default: ./lowp_demo.png)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of the report"
    )


def run(args: argparse.Namespace) -> int:
    """Run the demo with parsed `args`: progress on stderr, the report (or JSON) on
    stdout, the PNG where `--png` says. Returns the exit status."""
    started = time.perf_counter()
    try:
        presets = parse_presets(args.presets)
        png = _png_path(args.png)
        _check_requirements()
        torch_device, jax_device = choose_devices(args.device)
    except _CannotRun as err:
        print(f"lowp demo: error: {err}", file=sys.stderr)
        return 2

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    result = measure(presets, torch_device, jax_device, progress)
    result = dataclasses.replace(result, seconds=time.perf_counter() - started)
    try:
        demo_report.write_png(result, png)
        print(f"lowp demo: summary written to {png}", file=sys.stderr)
    except ImportError:
        print(f"lowp demo: no PNG written: {_NO_MATPLOTLIB}", file=sys.stderr)
        png = None
    if args.json:
        print(json.dumps(demo_report.to_json(result) | {"png": png}, indent=1))
    else:
        print(demo_report.text(result))
    return 0 if result.ok else 1


def measure(presets: list[str], torch_device: str, jax_device, progress) -> "Result":
    """Everything the report shows, for `presets` on the given devices; `progress(text)`
    is called before each step. Checkpoint files go to a temporary folder, removed after."""
    with (
        frameworks.one_torch_thread_on_cpu(torch_device),
        tempfile.TemporaryDirectory(prefix="lowp_demo_") as folder,
    ):
        progress(
            f"loading all-MiniLM-L6-v2 in PyTorch ({torch_device}) and JAX ({jax_device.platform})"
        )
        torch_side = frameworks.TorchMiniLM(torch_device)
        jax_side = frameworks.JaxMiniLM(jax_device)
        result = Result(
            frameworks={
                side.name: {"version": side.version, "device": side.device_name}
                for side in (torch_side, jax_side)
            },
            parameters=torch_side.parameter_count,
            sentences=len(frameworks.SENTENCES),
            unquantized={
                torch_side.name: fidelity(torch_side.reference, None),
                jax_side.name: fidelity(jax_side.reference, None),
            },
        )
        for preset in presets:
            result.presets.append(run_preset(preset, torch_side, jax_side, folder, progress))
    return result


# --- Results ---------------------------------------------------------------------------


@dataclasses.dataclass
class Fidelity:
    """Embeddings of the built-in sentences against the unquantized model's."""

    mean_cosine: float
    min_cosine: float
    pair_cosines: list[float]  # one per built-in pair (lowp_apps.minilm.SENTENCE_PAIRS)
    ranking_preserved: bool  # every paraphrase pair above every unrelated pair


@dataclasses.dataclass
class Checkpoint:
    """PyTorch -> lowp file -> JAX for one preset."""

    file_bytes: int
    quantized_match: bool  # loaded QArrays == the JAX-quantized ones, byte for byte
    plain_match: bool  # embeddings, LayerNorms, biases: the unquantized values, bit for bit
    plain_tensors: int
    numpy_match: bool  # lowp.load of the file == the PyTorch weights, byte for byte
    embeddings_identical: bool  # the loaded JAX model's embeddings == the JAX-quantized one's
    embeddings_max_abs_diff: float


@dataclasses.dataclass
class PresetResult:
    preset: str
    tensors: int  # quantized linear weights
    bytes: int  # codes + scales of those weights
    torch_jax_mismatches: list[str]  # tensor names whose bytes differ
    torch_numpy_mismatches: list[str]
    fidelity: dict[str, Fidelity]  # by framework
    torch_jax_min_cosine: float  # between the two frameworks' quantized embeddings
    checkpoint: Checkpoint
    seconds: dict[str, float]

    @property
    def ok(self) -> bool:
        c = self.checkpoint
        return not (self.torch_jax_mismatches or self.torch_numpy_mismatches) and (
            c.quantized_match and c.plain_match and c.numpy_match and c.embeddings_identical
        )


@dataclasses.dataclass
class Result:
    frameworks: dict[str, dict[str, str]]  # name -> version, device
    parameters: int
    sentences: int
    unquantized: dict[str, Fidelity]  # by framework (cosines 1; the pair ranking)
    presets: list[PresetResult] = dataclasses.field(default_factory=list)
    seconds: float = 0.0  # the whole run, set by `run`

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.presets)


# --- One preset ------------------------------------------------------------------------


def run_preset(preset: str, torch_side, jax_side, folder: str, progress) -> PresetResult:
    """Quantize in both frameworks, compare bytes and fidelity, round-trip the file."""
    seconds = {}
    start = time.perf_counter()
    progress(f"{preset}: PyTorch quantize_, embed, save_quantized")
    torch_model = torch_side.quantize(preset)
    torch_weights = torch_side.weights(torch_model)
    torch_embeddings = torch_side.embed(torch_model)
    path = os.path.join(folder, f"minilm_{preset}.safetensors")
    torch_side.save(torch_model, path)
    del torch_model
    seconds["pytorch"] = time.perf_counter() - start

    start = time.perf_counter()
    progress(f"{preset}: JAX quantize_model, embed")
    jax_model = jax_side.quantize(preset)
    jax_weights = jax_side.weights(jax_model)
    jax_embeddings = jax_side.embed(jax_model)
    seconds["jax"] = time.perf_counter() - start

    start = time.perf_counter()
    progress(f"{preset}: NumPy reference quantize; the PyTorch file into NumPy and JAX")
    numpy_weights = reference_weights(preset, sorted(torch_weights))
    from_file = lowp.load(path)
    loaded = jax_side.load(path, jax_model)
    loaded_embeddings = jax_side.embed(loaded)
    loaded_params, base_params = jax_side.parameters(loaded), jax_side.parameters(jax_side.base)
    plain = [n for n in base_params if n not in jax_weights]
    checkpoint = Checkpoint(
        file_bytes=os.path.getsize(path),
        quantized_match=not mismatches(jax_side.weights(loaded), jax_weights),
        plain_match=all(_same_bits(loaded_params[n], base_params[n]) for n in plain),
        plain_tensors=len(plain),
        numpy_match=not mismatches(
            {n: v for n, v in from_file.items() if isinstance(v, lowp.QTensor)}, torch_weights
        ),
        embeddings_identical=_same_bits(loaded_embeddings, jax_embeddings),
        embeddings_max_abs_diff=float(np.abs(loaded_embeddings - jax_embeddings).max()),
    )
    seconds["checkpoint"] = time.perf_counter() - start
    return PresetResult(
        preset=preset,
        tensors=len(torch_weights),
        bytes=sum(_nbytes(q) for q in torch_weights.values()),
        torch_jax_mismatches=mismatches(jax_weights, torch_weights),
        torch_numpy_mismatches=mismatches(numpy_weights, torch_weights),
        fidelity={
            torch_side.name: fidelity(torch_embeddings, torch_side.reference),
            jax_side.name: fidelity(jax_embeddings, jax_side.reference),
        },
        torch_jax_min_cosine=float(np.sum(torch_embeddings * jax_embeddings, axis=-1).min()),
        checkpoint=checkpoint,
        seconds=seconds,
    )


def reference_weights(preset: str, names: list[str]) -> dict[str, lowp.QTensor]:
    """The NumPy reference: `lowp.quantize` of each named checkpoint weight (out, in)."""
    scheme = lowp.InferenceConfig.from_name(preset).weight
    checkpoint = minilm.load_weights()
    return {name: lowp.quantize(checkpoint[name], scheme) for name in names}


def fidelity(embeddings: np.ndarray, reference: np.ndarray | None) -> Fidelity:
    """Cosines of unit-norm `embeddings` to `reference` (None: the unquantized model
    itself, cosine 1) and the built-in pair ranking."""
    cosine = np.ones(len(embeddings)) if reference is None else np.sum(embeddings * reference, -1)
    pairs = minilm.pair_cosines(embeddings)
    return Fidelity(
        mean_cosine=float(cosine.mean()),
        min_cosine=float(cosine.min()),
        pair_cosines=pairs,
        ranking_preserved=minilm.ranking_preserved(pairs),
    )


def mismatches(got: dict, want: dict) -> list[str]:
    """Names whose QTensors differ in metadata or in any byte of codes, scale or global
    scale, or that only one side has."""
    names = sorted(set(got) | set(want))
    return [n for n in names if n not in got or n not in want or not same_bytes(got[n], want[n])]


def same_bytes(a: lowp.QTensor, b: lowp.QTensor) -> bool:
    meta = ("scheme", "shape", "hp_dtype", "scale_layout")
    if any(getattr(a, k) != getattr(b, k) for k in meta):
        return False
    if (a.global_scale is None) != (b.global_scale is None):
        return False
    parts = [("codes", a.codes, b.codes), ("scale", a.scale, b.scale)]
    if a.global_scale is not None:
        parts.append(("global_scale", a.global_scale, b.global_scale))
    return all(_same_bits(x, y) for _, x, y in parts)


def _same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _nbytes(q: lowp.QTensor) -> int:
    return (
        q.codes.nbytes + q.scale.nbytes + (0 if q.global_scale is None else q.global_scale.nbytes)
    )


# --- Options, requirements, devices ---------------------------------------------------


def parse_presets(text: str) -> list[str]:
    """'all' or comma-separated preset names, in order, each once."""
    names = lowp.InferenceConfig.names()
    if text.strip() == "all":
        return list(names)
    presets = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in presets if p not in names]
    if unknown or not presets:
        raise _CannotRun(
            f"--presets {text!r}: unknown {unknown or 'empty'}; "
            f"choose from {', '.join(names)} or 'all'"
        )
    return presets


def _png_path(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise _CannotRun(f"--png {path!r}: no such directory {folder!r}")
    if not path.lower().endswith(".png") or os.path.isdir(path):
        raise _CannotRun(f"--png takes a .png file path, got {path!r}")
    return path


def _check_requirements() -> None:
    missing = []
    for module, what, pip in _REQUIREMENTS:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(f"{what} is not installed: {pip}")
    try:
        minilm.model_dir()
    except FileNotFoundError as err:
        missing.append(str(err))
    if missing:
        raise _CannotRun("missing requirements:\n  " + "\n  ".join(missing))


def choose_devices(choice: str):
    """(torch device, jax.Device): each framework's first GPU for "auto" where it has
    one, else its CPU; "cpu" forces the CPU; "gpu" refuses to run on a CPU."""
    import jax
    import torch

    if choice == "cpu":
        return "cpu", jax.devices("cpu")[0]
    torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        jax_device = jax.devices("gpu")[0]
    except RuntimeError:  # no GPU backend in this jax install, or none initialised
        jax_device = jax.devices("cpu")[0]
    if choice == "gpu":
        if torch_device == "cpu":
            raise _CannotRun(
                "--device gpu: torch sees no CUDA device (torch.cuda.is_available() is False)"
            )
        if jax_device.platform == "cpu":
            raise _CannotRun("--device gpu: jax sees no GPU (jax.devices('gpu') failed)")
    return torch_device, jax_device
