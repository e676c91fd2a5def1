"""PyTorch and JAX, given the same recipe, weights and batch, quantize every GEMM operand
of a linear layer's forward and backward to identical bytes (spec §8).

Both frontends expose the operands their training layers feed the three GEMMs through
`training_operands(x, w, g, recipe)`; each is compared with the other and with the NumPy
reference `lowp.quantize` of that GEMM's orientation of the high-precision tensor.
"""

import ml_dtypes
import numpy as np
import pytest

import lowp
from lowp.extend import LinearPlan

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
import lowp_jax
import lowp_torch

# x: (2, 32, 64) -> M = 64, K = 64, N = 96: every dim a multiple of the MX block.
SHAPES = {"x": (2, 32, 64), "w": (96, 64), "g": (2, 32, 96)}


def _inputs(dtype: str):
    rng = np.random.default_rng(6)
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    arrays["w"] *= 0.05
    arrays["g"] *= 1e-3  # gradients are small: the e5m2/e4m3 scales must follow them
    arrays["x"][0, 3] = 0.0  # an all-zero token row
    if dtype == "bfloat16":
        import ml_dtypes

        arrays = {k: v.astype(ml_dtypes.bfloat16) for k, v in arrays.items()}
    return arrays


def _reference(arrays, recipe):
    """The NumPy bytes of each GEMM's operands (lowp/_recipes.py orientation):
    `lowp.quantize` of each orientation, after the recipe's Hadamard transform and with
    its stochastic rounding where it has them (`OperandPlan.quantize_reference`)."""
    x = arrays["x"].reshape(-1, SHAPES["x"][-1])
    g = arrays["g"].reshape(-1, SHAPES["g"][-1])
    w = arrays["w"]
    tensors = {"forward": (x, w), "dgrad": (g, w.T), "wgrad": (g.T, x.T)}
    plan = LinearPlan.of(recipe)
    out = {}
    for gemm, (a, b) in tensors.items():
        gemm_plan = getattr(plan, gemm)
        if gemm_plan is None:
            out[gemm] = None
            continue
        out[gemm] = (
            gemm_plan.a.quantize_reference(np.ascontiguousarray(a)),
            gemm_plan.b.quantize_reference(np.ascontiguousarray(b)),
        )
    return out


def _same_bytes(got: lowp.QTensor, want: lowp.QTensor, where: str):
    assert got.scheme == want.scheme, where
    assert got.shape == want.shape, where
    np.testing.assert_array_equal(
        got.codes.view(np.uint8), want.codes.view(np.uint8), err_msg=f"{where}: codes"
    )
    np.testing.assert_array_equal(
        np.ascontiguousarray(got.scale).view(np.uint8),
        np.ascontiguousarray(want.scale).view(np.uint8),
        err_msg=f"{where}: scales",
    )
    assert (got.global_scale is None) == (want.global_scale is None), where
    if want.global_scale is not None:
        assert got.global_scale.tobytes() == want.global_scale.tobytes(), f"{where}: global"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", lowp.Recipe.names())
def test_torch_and_jax_quantize_every_training_gemm_operand_to_the_same_bytes(name, dtype):
    _both_frontends_give_the_reference(lowp.Recipe.from_name(name), dtype)


def _both_frontends_give_the_reference(recipe: lowp.Recipe, dtype: str = "float32"):
    """Every GEMM operand of `training_operands` in PyTorch and in JAX has the bytes of
    the NumPy reference (`_reference`) for `_inputs(dtype)`."""
    arrays = _inputs(dtype)
    torch_ops = lowp_torch.training_operands(
        *(
            torch.from_numpy(arrays[k].view(np.uint16)).view(torch.bfloat16)
            if dtype == "bfloat16"
            else torch.from_numpy(arrays[k])
            for k in ("x", "w", "g")
        ),
        recipe,
    )
    jax_ops = lowp_jax.training_operands(*(jnp.asarray(arrays[k]) for k in ("x", "w", "g")), recipe)
    want = _reference(arrays, recipe)
    assert set(torch_ops) == set(jax_ops) == set(want) == {"forward", "dgrad", "wgrad"}
    for gemm, pair in want.items():
        if pair is None:
            assert torch_ops[gemm] is None and jax_ops[gemm] is None, gemm
            continue
        for side, ref, t, j in zip("ab", pair, torch_ops[gemm], jax_ops[gemm], strict=True):
            where = f"{recipe.name} {dtype} {gemm}.{side}"
            _same_bytes(lowp_torch.to_lowp(t), ref, f"{where} (torch vs numpy)")
            _same_bytes(lowp_jax.to_lowp(j), ref, f"{where} (jax vs numpy)")


@pytest.mark.slow
@pytest.mark.parametrize("name", lowp.Recipe.names())
def test_mixed_precision_layers_agree_across_frameworks(name):
    """The layers as users build them, bf16 compute over float32 weights:
    `lowp_torch.Linear` under bf16 autocast and `lowp_jax.nnx.Linear(dtype=bfloat16)`.
    Both quantize the float32 weight and the bf16 input, and every GEMM (the
    high-precision wgrad of the _gw_hp recipes included) accumulates in float32 and
    rounds once: y (bf16) within one bf16 ulp of each other (the two CPU matmuls sum in
    different orders), dw (float32) to float32 rounding."""
    from flax import nnx

    import lowp_jax.nnx

    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    w = (rng.standard_normal((64, 128)) * 0.05).astype(np.float32)  # (out, in)
    g = (rng.standard_normal((64, 64)) * 1e-2).astype(np.float32)

    layer = lowp_torch.Linear(128, 64, bias=False, recipe=name)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    xt = torch.from_numpy(x).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt = layer(xt)
    yt.backward(torch.from_numpy(g).to(yt.dtype))

    # On the CPU too where JAX has a GPU: there its forward GEMM would use the GPU's fast
    # accumulation, which spec §7 holds to 40 dB, not to this test's ulp.
    with jax.default_device(jax.devices("cpu")[0]):
        jlayer = lowp_jax.nnx.Linear(
            128, 64, recipe=name, dtype=jnp.bfloat16, use_bias=False, rngs=nnx.Rngs(0)
        )
        jlayer.kernel.set_value(jnp.asarray(w.T))
        graphdef, state = nnx.split(jlayer)
        yj, vjp = jax.vjp(lambda s: nnx.merge(graphdef, s)(jnp.asarray(x)), state)
        (dstate,) = vjp(jnp.asarray(g).astype(jnp.bfloat16))
        dkj = dstate["kernel"].get_value()

    assert yt.dtype == torch.bfloat16 and yj.dtype == jnp.bfloat16
    y_torch = yt.detach().float().numpy()
    y_jax = np.asarray(yj.astype(jnp.float32))
    ulp = np.spacing(np.abs(y_torch).astype(ml_dtypes.bfloat16)).astype(np.float32)
    assert np.all(np.abs(y_torch - y_jax) <= ulp), name
    dw_torch, dw_jax = layer.weight.grad.numpy(), np.asarray(dkj).T
    assert dw_torch.dtype == dw_jax.dtype == np.float32
    np.testing.assert_allclose(dw_jax, dw_torch, rtol=0, atol=1e-5 * np.abs(dw_torch).max())


def test_a_recipe_of_a_scheme_no_frontend_names_trains_alike_in_both():
    """GroupScaling (float scales on groups of 16 along the reduction axis) in every GEMM:
    neither frontend has code for it, yet both quantize every operand to the reference's
    bytes and the torch layer's backward runs."""
    group = lowp.GroupScaling("float8_e4m3fn", block=16)
    spec = lowp.GemmSpec(group, group)
    recipe = lowp.Recipe("group16", forward=spec, dgrad=spec, wgrad=spec)
    rng = np.random.default_rng(3)
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((32, 64), (48, 64), (32, 48)))
    ops_torch = lowp_torch.training_operands(
        torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g), recipe
    )
    ops_jax = lowp_jax.training_operands(jnp.asarray(x), jnp.asarray(w), jnp.asarray(g), recipe)
    orientations = {"forward": (x, w), "dgrad": (g, w.T), "wgrad": (g.T, x.T)}
    for gemm, hps in orientations.items():
        for q_torch, q_jax, hp in zip(ops_torch[gemm], ops_jax[gemm], hps, strict=True):
            want = lowp.quantize(np.ascontiguousarray(hp), group)
            for got in (lowp_torch.to_lowp(q_torch), lowp_jax.to_lowp(q_jax)):
                np.testing.assert_array_equal(got.codes, want.codes)
                np.testing.assert_array_equal(got.scale, want.scale)
    layer = lowp_torch.convert_to_training(torch.nn.Linear(64, 48), recipe)
    layer(torch.from_numpy(x)).square().sum().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()


def _earlier_rounds_stochastically(scheme) -> lowp.Recipe:
    """`scheme` in every GEMM, dy rounded stochastically in the dgrad (its earlier GEMM)
    and to nearest in the wgrad, which reads it transposed with that very scheme."""
    plain = lowp.GemmSpec(scheme, scheme)
    dgrad = lowp.GemmSpec(scheme, scheme, a_rounding="stochastic")
    return lowp.Recipe("sr_dgrad_dy", forward=plain, dgrad=dgrad, wgrad=plain, seed=11)


@pytest.mark.parametrize(
    "scheme",
    [lowp.TensorScaling("float8_e5m2"), lowp.AxisScaling("float8_e5m2", pow2=True)],
    ids=["tensorwise", "rowwise"],
)
def test_stochastically_rounded_codes_are_not_reused_or_made_beside_the_plain_ones(scheme):
    """A tensor's earlier codes may serve its later transposed operand (`reuses_codes`,
    tensorwise) or be made with them from one read (`shares_scheme`, rowwise) only where
    they are that scheme's nearest bytes: dy rounded stochastically in the dgrad is not
    what the wgrad's plain dy.T takes. Both frontends give each operand the reference's
    bytes (before, tensorwise: torch rounded the dgrad's dy to nearest; rowwise: the
    plan offered the one-read cast, which the Triton casts would have taken)."""
    recipe = _earlier_rounds_stochastically(scheme)
    plan = LinearPlan.of(recipe)
    assert not plan.keeps_codes("g")
    assert not plan.wgrad.a.reuses_codes and not plan.wgrad.a.shares_scheme
    assert plan.keeps_codes("x") == plan.keeps_codes("w") == isinstance(scheme, lowp.TensorScaling)
    _both_frontends_give_the_reference(recipe)


@pytest.mark.parametrize(
    "forward", [{"a_rounding": "stochastic"}, {"hadamard": True}], ids=["sr", "hadamard"]
)
def test_the_forward_operands_take_their_rounding_and_transform(forward):
    """A recipe may round the forward's operands stochastically or transform them: both
    frontends quantize x and w as the plan says (JAX quantized them plainly before), and
    the backward, which cannot reuse such codes, makes its own."""
    tensorwise = lowp.TensorScaling("float8_e4m3fn")
    plain = lowp.GemmSpec(tensorwise, tensorwise)
    recipe = lowp.Recipe(
        "forward_not_plain",
        forward=lowp.GemmSpec(tensorwise, tensorwise, **forward),
        dgrad=plain,
        wgrad=plain,
        seed=5,
    )
    plan = LinearPlan.of(recipe)
    assert not plan.keeps_codes("x") and plan.keeps_codes("w") == ("hadamard" not in forward)
    _both_frontends_give_the_reference(recipe)
