"""The flax side: QuantizedDotGeneral in nnx.Linear and linen.Dense, lowp_jax.nnx.Linear,
lowp_jax.linen.Dense, quantize_params / quantize_model for every preset, and the
interchange file (save_quantized / load_quantized).

Layers are called eagerly on the shapes of jax_dot_cases, so the quantizers compiled for
test_jax_dot.py are reused when both files run in one process.
"""

import os

import jax
import jax.numpy as jnp
import jax_dot_cases as C
import numpy as np
import pytest

flax = pytest.importorskip("flax")
import flax.linen as nn
from flax import nnx

import lowp
import lowp_jax
import lowp_jax.linen
import lowp_jax.nnx


def _nnx_pair(preset, x_dtype=np.float32):
    """A high-precision nnx.Linear (K -> N) with a bias, and lowp_jax.nnx.Linear with the
    same parameters."""
    _, w = C.operands(C.SHAPES[2], hp_dtype=x_dtype)
    bias = jnp.linspace(-1, 1, C.N, dtype=x_dtype)
    layers = []
    for make in (nnx.Linear, lambda *a, **k: lowp_jax.nnx.Linear(*a, config=preset, **k)):
        layer = make(C.K, C.N, param_dtype=x_dtype, rngs=nnx.Rngs(0))
        layer.kernel.set_value(w.T)
        layer.bias.set_value(bias)
        layers.append(layer)
    return layers


@pytest.mark.parametrize("rank", [2, 3, 4])
@pytest.mark.parametrize("preset", C.PRESETS)
def test_quantized_nnx_linear_sqnr(preset, rank):
    """Quantized at each call or from quantize_params: the same bits, and within the
    SQNR floor against the high-precision layer (25 dB float8/mxfp8, 12 dB fp4)."""
    hp, q = _nnx_pair(preset)
    x, _ = C.operands(C.SHAPES[rank], seed=rank)
    want = hp(x)
    per_call = q(x)
    nnx.update(q, lowp_jax.quantize_params(nnx.state(q), preset))
    assert isinstance(q.kernel[...], lowp_jax.QArray) and q.kernel[...].shape == (C.N, C.K)
    stored = q(x)
    assert stored.shape == want.shape == C.SHAPES[rank][:-1] + (C.N,)
    np.testing.assert_array_equal(np.asarray(stored), np.asarray(per_call))
    db = C.sqnr_db(stored, want)
    assert db >= C.LAYER_SQNR_DB[preset], f"{preset}: {db:.1f} dB"


def test_bfloat16_compute_and_jit():
    """dtype=bfloat16 with a float32 QArray kernel: flax's promotion applies (the kernel
    dequantizes to bfloat16) and nnx.jit of the layer gives a bfloat16 output."""
    layer = lowp_jax.nnx.Linear(
        C.K, C.N, config="float8_rowwise", dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
    )
    nnx.update(layer, lowp_jax.quantize_params(nnx.state(layer), "float8_rowwise"))
    x, _ = C.operands(C.SHAPES[3])
    y = nnx.jit(lambda m, x: m(x))(layer, x)
    assert y.dtype == jnp.bfloat16 and y.shape == (2, 4, C.N)
    assert C.sqnr_db(y, layer(x.astype(jnp.bfloat16))) >= 40


@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8"])
def test_bfloat16_compute_quantizes_the_float32_kernel_per_call_as_ahead(preset):
    """dtype=bfloat16 over float32 parameters: quantizing at each call takes the float32
    kernel itself, as quantize_params (and lowp_torch) do, so the layer's output is the
    same bytes before and after its kernel is quantized ahead, and bfloat16."""
    x, _ = C.operands(C.SHAPES[2])
    x = x.astype(jnp.bfloat16)
    layer = lowp_jax.nnx.Linear(C.K, C.N, config=preset, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    per_call = layer(x)
    nnx.update(layer, lowp_jax.quantize_params(nnx.state(layer), preset))
    ahead = layer(x)
    assert per_call.dtype == ahead.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(per_call, np.float32), np.asarray(ahead, np.float32))

    dense = lowp_jax.linen.Dense(C.N, config=preset, dtype=jnp.bfloat16)
    params = dense.init(jax.random.key(0), x)
    per_call = dense.apply(params, x)
    ahead = dense.apply(lowp_jax.quantize_params(params, preset), x)
    assert per_call.dtype == ahead.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(per_call, np.float32), np.asarray(ahead, np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("preset", C.PRESETS)
def test_linen_dense_with_dot_general_cls_and_quantized_params(preset):
    x, w = C.operands(C.SHAPES[3])
    params = {"params": {"kernel": w.T, "bias": jnp.zeros(C.N)}}
    want = nn.Dense(C.N).apply(params, x)
    per_call = nn.Dense(C.N, dot_general_cls=lowp_jax.dot_general_cls(preset)).apply(params, x)
    dense = lowp_jax.linen.Dense(C.N, config=preset)
    np.testing.assert_array_equal(np.asarray(dense.apply(params, x)), np.asarray(per_call))
    qparams = lowp_jax.quantize_params(params, preset)
    stored = dense.apply(qparams, x)
    np.testing.assert_array_equal(np.asarray(stored), np.asarray(per_call))
    assert C.sqnr_db(stored, want) >= C.LAYER_SQNR_DB[preset]
    grad = jax.grad(lambda x: dense.apply(qparams, x).sum())(x)  # straight through
    assert grad.shape == x.shape and np.isfinite(np.asarray(grad)).all()


# Hidden width K: the activations have the shapes test_jax_dot.py compiled quantizers for.
class _NnxMLP(nnx.Module):
    def __init__(self, rngs):
        self.up = nnx.Linear(C.K, C.K, rngs=rngs)
        self.norm = nnx.LayerNorm(C.K, rngs=rngs)
        self.down = nnx.Linear(C.K, C.N, rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.norm(self.up(x))))


class _LinenMLP(nn.Module):
    dense: type = nn.Dense

    @nn.compact
    def __call__(self, x):
        x = jax.nn.gelu(nn.LayerNorm()(self.dense(C.K, name="up")(x)))
        return self.dense(C.N, name="down")(x)


def _check_quantized_tree(hp_leaves, q_leaves, preset):
    """Kernels: QArrays (out, in) with lowp's bytes for the transposed kernel; the rest as is."""
    weight = lowp.InferenceConfig.from_name(preset).weight
    kernels = 0
    for (path, hp), (qpath, q) in zip(hp_leaves, q_leaves, strict=True):
        assert path == qpath
        if lowp_jax._params.is_kernel(path, hp):
            kernels += 1
            want = lowp.quantize(np.ascontiguousarray(np.asarray(hp).T), weight)
            got = lowp_jax.to_lowp(q)
            assert got.scheme == weight and got.shape == want.shape
            np.testing.assert_array_equal(got.codes, want.codes)
            np.testing.assert_array_equal(
                got.scale.reshape(-1).view(np.uint8), want.scale.reshape(-1).view(np.uint8)
            )
        else:
            assert q is hp, path
    assert kernels == 2


@pytest.mark.slow
@pytest.mark.parametrize("preset", C.PRESETS)
def test_quantize_params_every_preset_nnx_and_linen(preset):
    x, _ = C.operands(C.SHAPES[2])
    model = _NnxMLP(nnx.Rngs(0))
    state = nnx.state(model)
    qstate = lowp_jax.quantize_params(state, preset)
    _check_quantized_tree(*(lowp_jax._params._flatten(s)[0] for s in (state, qstate)), preset)
    qmodel = lowp_jax.nnx.quantize_model(model, preset)
    assert isinstance(model.up.kernel[...], jax.Array)  # the original is untouched
    assert C.sqnr_db(qmodel(x), model(x)) >= C.LAYER_SQNR_DB[preset] - 3  # two layers

    params = _LinenMLP().init(jax.random.key(0), x)
    qparams = lowp_jax.quantize_params(params, preset)
    _check_quantized_tree(*(lowp_jax._params._flatten(p)[0] for p in (params, qparams)), preset)
    dense = _LinenMLP(dense=lambda n, name: lowp_jax.linen.Dense(n, config=preset, name=name))
    assert (
        C.sqnr_db(dense.apply(qparams, x), _LinenMLP().apply(params, x))
        >= C.LAYER_SQNR_DB[preset] - 3
    )


def test_quantize_params_filter_and_errors():
    model = _NnxMLP(nnx.Rngs(0))
    only_up = lowp_jax.quantize_params(nnx.state(model), "mxfp8", lambda path, k: path[0] == "up")
    assert isinstance(only_up["up"]["kernel"].get_value(), lowp_jax.QArray)
    assert isinstance(only_up["down"]["kernel"].get_value(), jax.Array)
    odd = {"params": {"head": {"kernel": jnp.ones((48, 8))}}}  # in_features 48: no 32-block fits
    with pytest.raises(ValueError, match=r"params\.head\.kernel \(in_features=48.*filter_fn"):
        lowp_jax.quantize_params(odd, "mxfp8")
    with pytest.raises(TypeError, match="already quantized"):
        lowp_jax.quantize_params(lowp_jax.quantize_params(odd, "float8_rowwise"), "float8_rowwise")
    with pytest.raises(ValueError, match="unknown inference preset"):
        lowp_jax.quantize_params(odd, "int8")


def test_quantized_dot_general_is_static_and_hashable():
    a = lowp_jax.QuantizedDotGeneral("nvfp4")
    b = lowp_jax.QuantizedDotGeneral(lowp.InferenceConfig.from_name("nvfp4"))
    assert a == b and hash(a) == hash(b) and jax.tree_util.tree_leaves(a) == []
    with pytest.raises(ValueError, match="impl must be one of"):
        lowp_jax.QuantizedDotGeneral("nvfp4", impl="cudnn")
    x, w = C.operands(C.SHAPES[2])
    with pytest.raises(NotImplementedError, match="out_sharding"):
        a(x, w.T, (((1,), (0,)), ((), ())), out_sharding=object())
    q = lowp_jax.quantize(w, lowp.TensorScaling())
    assert q[...] is q  # how nnx reads a parameter
    with pytest.raises(TypeError, match=r"only q\[\.\.\.\]"):
        q[0]


@pytest.mark.parametrize("preset", C.PRESETS)
def test_save_load_round_trip_is_bit_exact(preset, tmp_path):
    x, _ = C.operands(C.SHAPES[2])
    model = _NnxMLP(nnx.Rngs(1))
    qmodel = lowp_jax.nnx.quantize_model(model, preset)
    qstate = nnx.state(qmodel)
    path = os.fspath(tmp_path / "mlp.safetensors")
    lowp_jax.save_quantized(qstate, path)
    on_disk = lowp.load(path)
    assert isinstance(on_disk["up.kernel"], lowp.QTensor) and on_disk["up.kernel"].shape == (
        C.K,
        C.K,
    )
    assert on_disk["norm.scale"].shape == (C.K,)
    for like in (qstate, nnx.state(model)):  # a quantized tree, or the high-precision one
        loaded = lowp_jax.load_quantized(path, like)
        for (_p, a), (_, b) in zip(
            *(lowp_jax._params._flatten(s)[0] for s in (qstate, loaded)), strict=True
        ):
            if isinstance(a, lowp_jax.QArray):
                for field in ("codes", "scale", "global_scale"):
                    np.testing.assert_array_equal(
                        np.asarray(getattr(lowp_jax.to_lowp(a), field)),
                        np.asarray(getattr(lowp_jax.to_lowp(b), field)),
                    )
            else:
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    fresh = lowp_jax.nnx.quantize_model(_NnxMLP(nnx.Rngs(2)), preset)
    nnx.update(fresh, lowp_jax.load_quantized(path, nnx.state(fresh)))
    np.testing.assert_array_equal(np.asarray(fresh(x)), np.asarray(qmodel(x)))


def test_high_precision_kernels_are_stored_out_in_and_linen_round_trips(tmp_path):
    x, _ = C.operands(C.SHAPES[2])
    params = _LinenMLP().init(jax.random.key(0), x)
    path = os.fspath(tmp_path / "linen.safetensors")
    lowp_jax.save_quantized(params, path)
    stored = lowp.load(path)
    np.testing.assert_array_equal(
        stored["params.up.kernel"], np.asarray(params["params"]["up"]["kernel"]).T
    )
    again = lowp_jax.load_quantized(path, params)
    assert jax.tree_util.tree_all(jax.tree.map(lambda a, b: bool((a == b).all()), params, again))
    qparams = lowp_jax.quantize_params(params, "float8_block")
    lowp_jax.save_quantized(qparams, path)
    loaded = lowp_jax.load_quantized(path, params)
    dense = _LinenMLP(
        dense=lambda n, name: lowp_jax.linen.Dense(n, config="float8_block", name=name)
    )
    np.testing.assert_array_equal(
        np.asarray(dense.apply(loaded, x)), np.asarray(dense.apply(qparams, x))
    )
    with pytest.raises(ValueError, match="has no tensor 'params.extra.kernel'"):
        lowp_jax.load_quantized(
            path, {**params, "params": {**params["params"], "extra": {"kernel": jnp.ones((2, 2))}}}
        )
    with pytest.raises(ValueError, match="tensors the tree lacks"):
        lowp_jax.load_quantized(
            path, {"params": {k: v for k, v in params["params"].items() if k != "up"}}
        )


def test_a_file_written_elsewhere_loads_under_its_names(tmp_path):
    """The spec §9 file another frontend writes: (out, in) weights under its own names
    (torch's `up.weight`), QTensors from lowp (NumPy) here. Loaded through `names`, the
    kernels hold lowp's bytes and the layers run on them."""
    x, _ = C.operands(C.SHAPES[2])
    model = _NnxMLP(nnx.Rngs(3))
    torch_names = {"kernel": "weight", "bias": "bias", "scale": "weight"}

    def names(path):
        return ".".join(map(str, path[:-1])) + "." + torch_names[path[-1]]

    weight = lowp.InferenceConfig.from_name("nvfp4").weight
    tensors = {}
    for path, value in lowp_jax._params._flatten(nnx.state(model))[0]:
        value = np.asarray(value)
        tensors[names(path)] = (
            lowp.quantize(np.ascontiguousarray(value.T), weight) if path[-1] == "kernel" else value
        )
    path = os.fspath(tmp_path / "from_torch.safetensors")
    lowp.save(path, tensors)
    loaded = lowp_jax.load_quantized(path, nnx.state(model), names=names)
    qmodel = lowp_jax.nnx.quantize_model(model, "nvfp4")
    nnx.update(qmodel, loaded)
    kernel = qmodel.up.kernel[...]
    np.testing.assert_array_equal(
        np.asarray(lowp_jax.to_lowp(kernel).codes), tensors["up.weight"].codes
    )
    np.testing.assert_array_equal(
        np.asarray(kernel.dequantize()), lowp.dequantize(tensors["up.weight"])
    )
    assert C.sqnr_db(qmodel(x), model(x)) >= C.LAYER_SQNR_DB["nvfp4"] - 3


def test_quantize_model_converts_only_linear_layers():
    """A rank-2 kernel of another layer (nnx.LinearGeneral) stays high precision: only
    nnx.Linear layers get the quantized dot that can use a QArray (out, in)."""

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.proj = nnx.LinearGeneral(64, 32, rngs=rngs)
            self.fc = nnx.Linear(32, 16, rngs=rngs)

        def __call__(self, x):
            return self.fc(self.proj(x))

    model = Model(nnx.Rngs(0))
    quantized = lowp_jax.nnx.quantize_model(model, "float8_rowwise")
    assert not isinstance(quantized.proj.kernel[...], lowp_jax.QArray)
    assert isinstance(quantized.fc.kernel[...], lowp_jax.QArray)
    assert quantized(jnp.ones((2, 64))).shape == (2, 16)


def test_save_quantized_names_a_prng_key_it_cannot_hold(tmp_path):
    class Model(nnx.Module):
        def __init__(self, rngs):
            self.fc = nnx.Linear(64, 32, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

    model = lowp_jax.to_inference(Model(nnx.Rngs(0)), "float8_rowwise")
    path = tmp_path / "m.safetensors"
    with pytest.raises(TypeError, match=r"drop\.rngs\.key is a PRNG key.*nnx\.Param"):
        lowp_jax.save_quantized(nnx.state(model), path, config="float8_rowwise")
    lowp_jax.save_quantized(nnx.state(model, nnx.Param), path, config="float8_rowwise")
