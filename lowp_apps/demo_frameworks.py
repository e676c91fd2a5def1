"""The two frameworks' halves of `lowp demo`: all-MiniLM-L6-v2 in PyTorch and in JAX,
quantized with a preset, embedding the built-in sentences, and written to / read from
lowp's interchange file.

Each half hands back plain NumPy: quantized weights as `lowp.QTensor`s under the
checkpoint's tensor names, embeddings as float64 arrays, so `lowp_apps.demo` compares the
two frameworks without touching either. lowp's core imports no frontend, so torch, jax
and flax are imported here only inside the methods (the CLI loads this module after
checking they are installed).
"""

import contextlib

import numpy as np

import lowp
from lowp_apps import minilm

SENTENCES = list(minilm.SENTENCES)


class TorchMiniLM:
    """`lowp_apps.models.torch_minilm.MiniLM` on `device` ("cpu" or "cuda")."""

    name = "PyTorch"

    def __init__(self, device: str):
        import torch

        from lowp_apps.models.torch_minilm import MiniLM

        self.device = device
        self.version = torch.__version__
        self.device_name = f"cuda ({torch.cuda.get_device_name(0)})" if device == "cuda" else "cpu"
        self.base = MiniLM.from_pretrained(device=device)
        self.parameter_count = sum(p.numel() for p in self.base.parameters())
        self.reference = self.embed()  # the unquantized model's, for every preset

    def quantize(self, preset: str):
        """A quantized copy of the model (`lowp_torch.quantize_`)."""
        import copy

        import lowp_torch

        return lowp_torch.quantize_(copy.deepcopy(self.base), preset)

    def embed(self, model=None) -> np.ndarray:
        """Unit-norm embeddings of SENTENCES, (24, 384) float64; default the float model."""
        model = self.base if model is None else model
        return model.embed(SENTENCES).numpy(force=True).astype(np.float64)

    def weights(self, model) -> dict[str, lowp.QTensor]:
        """The quantized linear weights by checkpoint name, as NumPy QTensors (a copy)."""
        import lowp_torch

        return {
            name: lowp_torch.to_lowp(t)
            for name, t in model.state_dict().items()
            if isinstance(t, lowp_torch.QuantizedTensor)
        }

    def save(self, model, path) -> None:
        import lowp_torch

        lowp_torch.save_quantized(model, path)


class JaxMiniLM:
    """`lowp_apps.models.jax_minilm.MiniLM` (flax nnx) with its arrays on `device`.

    The forward runs eagerly: quantize and dequantize are compiled once per shape, but
    compiling each quantized model whole costs 5-30 s per preset on a CPU, more than
    running it.
    """

    name = "JAX"

    def __init__(self, device):
        import jax

        from lowp_apps.models import jax_minilm

        self.device = device
        self.version = jax.__version__
        self.device_name = (
            "cpu" if device.platform == "cpu" else f"{device.platform} ({device.device_kind})"
        )
        with jax.default_device(device):
            self.base = jax_minilm.MiniLM.from_pretrained()
            ids, mask = self.base.tokenizer(SENTENCES)
            self._ids, self._mask = jax.numpy.asarray(ids, jax.numpy.int32), jax.numpy.asarray(mask)
        self.reference = self.embed()  # the unquantized model's, for every preset

    def quantize(self, preset: str):
        """A quantized copy of the model (`lowp_jax.nnx.quantize_model`)."""
        import jax

        import lowp_jax.nnx

        # lowp_jax's impl="auto" asks the default backend, not where the arrays live: with
        # --device cpu on a GPU machine it would pick the GPU's fp8 GEMM for CPU arrays.
        # On a CPU "auto" means "emulated" anyway.
        impl = "emulated" if self.device.platform == "cpu" else "auto"
        with jax.default_device(self.device):
            return lowp_jax.nnx.quantize_model(self.base, preset, impl=impl)

    def embed(self, model=None) -> np.ndarray:
        """Unit-norm embeddings of SENTENCES, (24, 384) float64; default the float model."""
        import jax

        from lowp_apps.models import jax_minilm

        model = self.base if model is None else model
        with jax.default_device(self.device):
            hidden = model(self._ids, self._mask)
            embeddings = jax_minilm.mean_pool_normalize(hidden, self._mask)
        return np.asarray(jax.device_get(embeddings), np.float64)

    def weights(self, model) -> dict[str, lowp.QTensor]:
        """The quantized kernels by checkpoint name, as NumPy QTensors (out, in)."""
        import lowp_jax

        return {
            name: lowp_jax.to_lowp(value)
            for name, value in self.parameters(model).items()
            if isinstance(value, lowp_jax.QArray)
        }

    def parameters(self, model) -> dict:
        """Every parameter by checkpoint name: QArray kernels, jax arrays otherwise."""
        from flax import nnx

        from lowp_apps.models import jax_minilm

        return {
            jax_minilm.kernel_name(path): variable.get_value()
            for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param))
        }

    def load(self, path, like):
        """The model `like` (a quantized one: it gives the structure and the quantized
        dot) with every parameter read from the file at `path` (`lowp_jax.load_quantized`,
        the checkpoint's tensor names mapped by `kernel_name`)."""
        import jax
        from flax import nnx

        import lowp_jax
        from lowp_apps.models import jax_minilm

        graphdef, state = nnx.split(like)
        with jax.default_device(self.device):
            loaded = lowp_jax.load_quantized(path, state, names=jax_minilm.kernel_name)
        return nnx.merge(graphdef, loaded)


@contextlib.contextmanager
def one_torch_thread_on_cpu(device: str):
    """torch on one intra-op thread while the demo runs on a CPU, restored afterwards.
    lowp_torch's quantize and emulated GEMMs are chains of small elementwise ops; with
    torch's default two OpenMP threads on a busy 2-core machine the demo's PyTorch half
    ran 15x slower than with one (30 s vs 2 s for two presets)."""
    import torch

    before = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
