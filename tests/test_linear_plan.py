"""The plan of a linear layer's training step (lowp/_linear_plan.py): spec §8's
orientation table, the schemes, which operands reuse codes, what each GEMM keeps, and the
shape checks both frontends run."""

import dataclasses

import pytest

import lowp
from lowp.extend import LinearPlan, OperandPlan

E4M3, E5M2 = "float8_e4m3fn", "float8_e5m2"
ROWWISE = lowp.AxisScaling(E4M3, pow2=True)
MX = lowp.MXScaling(E4M3, mode="rceil")

# Spec §8: each GEMM `a @ b.T` as (operand name, its dims as the GEMM reads it).
ORIENTATION = {
    "forward": (("x", ("M", "K")), ("w", ("N", "K"))),
    "dgrad": (("g", ("M", "N")), ("w.T", ("K", "N"))),
    "wgrad": (("g.T", ("N", "M")), ("x.T", ("K", "M"))),
}
# Per recipe: the tensors whose transposed operand reuses the earlier codes (and so
# whose earlier GEMM keeps them), and those whose two operands share a scheme that a
# frontend may apply both ways from one read.
REUSE = {
    "float8_tensorwise": ({"x", "w", "g"}, set()),
    "float8_rowwise": (set(), {"x", "w", "g"}),
    "float8_rowwise_gw_hp": (set(), set()),  # dgrad's w.T is tensorwise, forward's w rowwise
    "mxfp8": (set(), {"x", "w", "g"}),
    "mxfp8_gw_hp": (set(), {"w"}),  # no wgrad GEMM: x and g are kept in high precision
    "float8_blockwise": ({"w"}, {"x", "g"}),  # 128x128 tiles: w's codes, transposed, are w.T's
    "float8_blockwise_ue8m0": ({"w"}, {"x", "g"}),
    "nvfp4": (set(), set()),  # packed fp4, stochastic rounding, Hadamard: each its own codes
}


@pytest.mark.parametrize("name", lowp.Recipe.names())
def test_every_recipe_plans_spec_8s_orientation_and_its_own_schemes(name):
    recipe = lowp.Recipe.from_name(name)
    plan = LinearPlan.of(recipe)
    assert plan.recipe is recipe
    for gemm, operands in ORIENTATION.items():
        spec, gemm_plan = getattr(recipe, gemm), getattr(plan, gemm)
        if spec.high_precision:
            assert gemm_plan is None, gemm
            continue
        assert gemm_plan.name == gemm and gemm_plan.fast_accum == spec.fast_accum
        for op, scheme, (op_name, dims) in zip(
            (gemm_plan.a, gemm_plan.b), (spec.a, spec.b), operands, strict=True
        ):
            assert (op.name, op.dims, op.scheme) == (op_name, dims, scheme), (gemm, op)
            assert op.transposed == op_name.endswith(".T")
    assert plan.forward.dims == ("M", "K", "N")
    if plan.dgrad is not None:
        assert plan.dgrad.dims == ("M", "N", "K")
    if plan.wgrad is not None:
        assert plan.wgrad.dims == ("N", "M", "K")


@pytest.mark.parametrize("name", lowp.Recipe.names())
def test_reuse_keeping_and_shared_schemes_follow_one_rule(name):
    plan = LinearPlan.of(lowp.Recipe.from_name(name))
    reused, shared = REUSE[name]
    earlier = {"x": plan.forward.a, "w": plan.forward.b, "g": plan.dgrad and plan.dgrad.a}
    for tensor in ("x", "w", "g"):
        later = plan.transposed_operand(tensor)
        assert plan.keeps_codes(tensor) == (tensor in reused), tensor
        if later is None:
            assert tensor not in reused | shared
            continue
        assert later.tensor == tensor and later.transposed
        # the earlier scheme, where that quantization was plain (nvfp4's dy: stochastic)
        assert later.earlier == (earlier[tensor].scheme if earlier[tensor].plain else None)
        assert later.reuses_codes == (tensor in reused), tensor
        assert later.shares_scheme == (tensor in shared), tensor
    for op in (plan.forward.a, plan.forward.b, plan.dgrad.a):  # read as they lie
        assert op.earlier is None and not op.reuses_codes and not op.shares_scheme


def test_reuse_needs_tensorwise_and_the_very_same_scheme():
    tensorwise = lowp.TensorScaling(E4M3)
    cases = [
        (tensorwise, tensorwise, True),
        (tensorwise, lowp.TensorScaling(E4M3, pow2=True), False),
        (tensorwise, lowp.TensorScaling(E5M2), False),
        (tensorwise, ROWWISE, False),
        (tensorwise, None, False),
        (ROWWISE, ROWWISE, False),  # rowwise along K is not rowwise along M
    ]
    for scheme, earlier, reused in cases:
        op = OperandPlan("x", True, scheme, earlier)
        assert op.reuses_codes is reused, (scheme, earlier)


@pytest.mark.parametrize("earlier", [{"a_rounding": "stochastic"}, {"hadamard": True}])
def test_codes_of_a_stochastic_or_transformed_quantization_are_not_reused(earlier):
    """dy quantized in the dgrad with stochastic rounding or after the Hadamard transform
    is not TensorScaling's bytes of dy: the wgrad's plain dy.T with that scheme neither
    reuses those codes nor is made beside them from one read."""
    tensorwise = lowp.TensorScaling(E5M2)
    recipe = lowp.Recipe(
        "dgrad_not_plain",
        forward=lowp.GemmSpec(tensorwise, tensorwise),
        dgrad=lowp.GemmSpec(tensorwise, tensorwise, **earlier),
        wgrad=lowp.GemmSpec(tensorwise, tensorwise),
    )
    plan = LinearPlan.of(recipe)
    later = plan.transposed_operand("g")
    assert later.plain and later.earlier is None
    assert not later.reuses_codes and not later.shares_scheme and not plan.keeps_codes("g")
    assert plan.keeps_codes("x")  # the forward's x is plain: reused as before


def test_a_gradient_not_quantized_by_a_high_precision_dgrad_is_not_reused():
    tensorwise = lowp.TensorScaling(E5M2)
    recipe = lowp.Recipe(
        "dgrad_hp",
        forward=lowp.GemmSpec(tensorwise, tensorwise),
        dgrad=lowp.GemmSpec(None, None),
        wgrad=lowp.GemmSpec(tensorwise, tensorwise),
    )
    plan = LinearPlan.of(recipe)
    assert plan.dgrad is None and plan.transposed_operand("w") is None
    assert plan.wgrad.a.earlier is None and not plan.keeps_codes("g")
    assert plan.keeps_codes("x") and not plan.keeps_codes("w")


@pytest.mark.parametrize(
    "scheme, along_first",
    [
        (lowp.TensorScaling(E5M2), lowp.TensorScaling(E5M2)),
        (ROWWISE, dataclasses.replace(ROWWISE, axis=-2)),
        (MX, dataclasses.replace(MX, axis=-2)),
        (lowp.BlockScaling(E4M3, block=(1, 128)), lowp.BlockScaling(E4M3, block=(128, 1))),
        (lowp.MXScaling("float4_e2m1fn"), None),  # packed fp4: quantize a transposed copy
        (lowp.NVFP4Scaling(), None),
        (lowp.GroupScaling(E4M3, block=16), lowp.GroupScaling(E4M3, block=16, axis=-2)),
    ],
)
def test_a_transposed_operand_is_quantized_along_its_tensors_first_axis(scheme, along_first):
    assert OperandPlan("x", True, scheme).along_first_axis == along_first
    assert OperandPlan("x", False, scheme).along_first_axis is None
    if along_first is None:
        assert not OperandPlan("x", True, scheme, scheme).shares_scheme


def test_checks_name_the_gemm_the_operand_and_the_dim():
    plan = LinearPlan.of(lowp.Recipe.from_name("mxfp8"))
    plan.check(64, 128, 96)
    plan.check(None, 128, 96)  # M not known yet: K and N alone
    cases = [
        (
            (64, 48, 96),
            r"^the mxfp8 forward GEMM cannot quantize x of shape \(64, 48\) along K = 48 "
            + r"\(in_features\): block 32 does not divide",
        ),
        (
            (None, 128, 100),
            r"^the mxfp8 dgrad GEMM cannot quantize g of shape \(0, 100\) along N = 100 "
            + r"\(out_features\)",
        ),
        (
            (10, 128, 96),
            r"^the mxfp8 wgrad GEMM cannot quantize g\.T of shape \(96, 10\) along M = 10 "
            + r"\(tokens\)",
        ),
    ]
    for (m, k, n), match in cases:
        with pytest.raises(ValueError, match=match):
            plan.check(m, k, n)
    plan.check(10, 128, 96, backward=False)  # the forward alone does not reduce over M
    gw_hp = LinearPlan.of(lowp.Recipe.from_name("mxfp8_gw_hp"))
    gw_hp.check(10, 128, 96)  # no quantized GEMM reduces over M
    with pytest.raises(ValueError, match=r"dgrad GEMM cannot quantize w\.T of shape \(128, 40\)"):
        LinearPlan.of(dataclasses.replace(gw_hp.recipe, dgrad=lowp.GemmSpec(ROWWISE, MX))).check(
            64, 128, 40
        )


def test_block_scaled_recipes_and_a_plan_is_a_static_value():
    assert [lowp.Recipe.from_name(n).block_scaled for n in lowp.Recipe.names()] == [
        False,
        False,
        False,
        True,
        True,
        False,
        False,
        True,
    ]
    mixed = dataclasses.replace(
        lowp.Recipe.from_name("float8_rowwise"), dgrad=lowp.GemmSpec(ROWWISE, MX)
    )
    assert mixed.block_scaled  # any quantized GEMM's operand
    plan = LinearPlan.of(lowp.Recipe.from_name("mxfp8"))
    assert plan == LinearPlan.of(lowp.Recipe.from_name("mxfp8")) and hash(plan) == hash(
        LinearPlan.of(lowp.Recipe.from_name("mxfp8"))
    )
    with pytest.raises(TypeError, match="expected a lowp.Recipe"):
        LinearPlan.of("mxfp8")
    with pytest.raises(ValueError, match=r"tensors are \('x', 'w', 'g'\), got 'dy'"):
        plan.keeps_codes("dy")
