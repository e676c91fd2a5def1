"""Schemes, recipes and presets check themselves (spec §3, §8)."""

import dataclasses
import math

import numpy as np
import pytest

import lowp


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: lowp.TensorScaling("float8_e4m3"), ValueError, "'float8_e4m3'"),
        (lambda: lowp.TensorScaling(pow2=1), TypeError, "pow2"),
        (lambda: lowp.AxisScaling(axis=1.0), TypeError, "axis"),
        (lambda: lowp.BlockScaling(block=(1, 0)), ValueError, "block"),
        (lambda: lowp.BlockScaling(block=128), ValueError, "pair"),
        (lambda: lowp.MXScaling(mode="round"), ValueError, "'round'"),
        (lambda: lowp.MXScaling(block=-32), ValueError, "-32"),
        (lambda: lowp.MXScaling(fmt="float8_e8m0fnu"), ValueError, "float8_e8m0fnu"),
        (lambda: lowp.NVFP4Scaling(global_scale="yes"), TypeError, "global_scale"),
    ],
)
def test_schemes_refuse_bad_fields(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_schemes_are_frozen_and_hashable():
    s = lowp.BlockScaling(block=[128, 128])
    assert s.block == (128, 128) and hash(s) == hash(lowp.BlockScaling(block=(128, 128)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.pow2 = True


def test_scale_shapes():
    assert lowp.TensorScaling().scale_shape((3, 4)) == ()
    assert lowp.AxisScaling(axis=0).scale_shape((3, 4)) == (1, 4)
    assert lowp.BlockScaling(block=(2, 3)).scale_shape((5, 3, 7)) == (5, 2, 3)
    assert lowp.MXScaling(axis=-2).scale_shape((2, 64, 3)) == (2, 2, 3)
    assert lowp.NVFP4Scaling().scale_shape((4, 64)) == (4, 4)


@pytest.mark.parametrize(
    "name, forward, dgrad, wgrad",
    [
        (
            "float8_tensorwise",
            (lowp.TensorScaling("float8_e4m3fn"), lowp.TensorScaling("float8_e4m3fn")),
            (lowp.TensorScaling("float8_e5m2"), lowp.TensorScaling("float8_e4m3fn")),
            (lowp.TensorScaling("float8_e5m2"), lowp.TensorScaling("float8_e4m3fn")),
        ),
        (
            "float8_rowwise",
            (lowp.AxisScaling(pow2=True),) * 2,
            (lowp.AxisScaling(pow2=True),) * 2,
            (lowp.AxisScaling(pow2=True),) * 2,
        ),
        (
            "float8_rowwise_gw_hp",
            (lowp.AxisScaling(pow2=True),) * 2,
            (lowp.AxisScaling(pow2=True), lowp.TensorScaling(pow2=True)),
            (None, None),
        ),
        (
            "mxfp8",
            (lowp.MXScaling(mode="rceil"),) * 2,
            (lowp.MXScaling(mode="rceil"),) * 2,
            (lowp.MXScaling(mode="rceil"),) * 2,
        ),
        (
            "mxfp8_gw_hp",
            (lowp.MXScaling(mode="rceil"),) * 2,
            (lowp.MXScaling(mode="rceil"),) * 2,
            (None, None),
        ),
    ],
)
def test_recipes_follow_the_spec_table(name, forward, dgrad, wgrad):
    recipe = lowp.Recipe.from_name(name)
    assert recipe.name == name
    for gemm, (a, b) in ((recipe.forward, forward), (recipe.dgrad, dgrad), (recipe.wgrad, wgrad)):
        assert (gemm.a, gemm.b) == (a, b)
    assert recipe.forward.fast_accum and not recipe.dgrad.fast_accum and not recipe.wgrad.fast_accum
    assert recipe.wgrad.high_precision == (wgrad == (None, None))


@pytest.mark.parametrize(
    "name, pow2", [("float8_blockwise", False), ("float8_blockwise_ue8m0", True)]
)
def test_blockwise_recipes_are_deepseek_v3s_tiles(name, pow2):
    """1x128 along each GEMM's reduction axis for x, dy and their transposes, 128x128 for
    w and w.T, e4m3 everywhere; ue8m0: power-of-two float32 scales. No fast accumulation
    (DeepSeek-V3 promotes its partial sums to float32 every 128)."""
    recipe = lowp.Recipe.from_name(name)
    act = lowp.BlockScaling("float8_e4m3fn", block=(1, 128), pow2=pow2)
    weight = lowp.BlockScaling("float8_e4m3fn", block=(128, 128), pow2=pow2)
    assert recipe.name == name
    assert (recipe.forward.a, recipe.forward.b) == (act, weight)
    assert (recipe.dgrad.a, recipe.dgrad.b) == (act, weight)
    assert (recipe.wgrad.a, recipe.wgrad.b) == (act, act)
    assert not any(s.fast_accum for s in (recipe.forward, recipe.dgrad, recipe.wgrad))
    assert not recipe.block_scaled  # float8 GEMMs: sm_89+/sm_90, not MX's sm_100


def test_recipe_names_and_errors():
    assert lowp.Recipe.names() == (
        "float8_tensorwise",
        "float8_rowwise",
        "float8_rowwise_gw_hp",
        "mxfp8",
        "mxfp8_gw_hp",
        "float8_blockwise",
        "float8_blockwise_ue8m0",
        "nvfp4",
    )
    with pytest.raises(ValueError, match="torchao's name for 'float8_rowwise_gw_hp'"):
        lowp.Recipe.from_name("rowwise_with_gw_hp")
    with pytest.raises(ValueError, match="'nvfp8'"):
        lowp.Recipe.from_name("nvfp8")
    with pytest.raises(ValueError, match="both operands or neither"):
        lowp.GemmSpec(lowp.TensorScaling(), None)
    with pytest.raises(ValueError, match="axis must be -1"):
        lowp.GemmSpec(lowp.AxisScaling(axis=0), lowp.AxisScaling())
    with pytest.raises(ValueError, match="forward GEMM must be quantized"):
        lowp.Recipe(
            "x", lowp.GemmSpec(None, None), lowp.GemmSpec(None, None), lowp.GemmSpec(None, None)
        )


def test_recipes_are_frozen_and_replaceable():
    recipe = lowp.Recipe.from_name("mxfp8")
    accumulating = dataclasses.replace(recipe, fp32_weight_grad_accumulation=True)
    assert accumulating.fp32_weight_grad_accumulation and not recipe.fp32_weight_grad_accumulation
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.name = "other"


@pytest.mark.parametrize(
    "name, weight, activation",
    [
        ("float8_tensorwise", lowp.TensorScaling(), lowp.TensorScaling()),
        ("float8_rowwise", lowp.AxisScaling(), lowp.AxisScaling()),
        ("float8_weight_only", lowp.AxisScaling(), None),
        ("float8_block", lowp.BlockScaling(block=(128, 128)), lowp.BlockScaling(block=(1, 128))),
        ("mxfp8", lowp.MXScaling(mode="rceil"), lowp.MXScaling(mode="rceil")),
        (
            "mxfp4",
            lowp.MXScaling("float4_e2m1fn", mode="rceil"),
            lowp.MXScaling("float4_e2m1fn", mode="rceil"),
        ),
        ("nvfp4", lowp.NVFP4Scaling(), lowp.NVFP4Scaling()),
    ],
)
def test_inference_presets_follow_the_spec_table(name, weight, activation):
    config = lowp.InferenceConfig.from_name(name)
    assert (config.weight, config.activation) == (weight, activation)


def test_inference_config_checks_its_fields():
    with pytest.raises(ValueError, match="'int8'"):
        lowp.InferenceConfig.from_name("int8")
    with pytest.raises(TypeError, match="scheme"):
        lowp.InferenceConfig(weight="float8_e4m3fn")
    for fields in (
        {"weight": lowp.AxisScaling(axis=0)},
        {"weight": lowp.AxisScaling(), "activation": lowp.MXScaling(axis=0)},
    ):
        with pytest.raises(ValueError, match=r"scales along in_features, axis -1; got \w+Scaling"):
            lowp.InferenceConfig(**fields)


def test_from_spec_builds_every_kind():
    from lowp._schemes import from_spec

    assert from_spec("tensor") == lowp.TensorScaling()
    assert from_spec("axis:axis=0:pow2=true") == lowp.AxisScaling(axis=0, pow2=True)
    assert from_spec("block:block=128x128") == lowp.BlockScaling(block=(128, 128))
    assert from_spec("mx:fmt=float4_e2m1fn:mode=rceil:axis=-1") == lowp.MXScaling(
        "float4_e2m1fn", mode="rceil"
    )
    assert from_spec("nvfp4:global_scale=false:block=32") == lowp.NVFP4Scaling(
        block=32, global_scale=False
    )


@pytest.mark.parametrize(
    "spec, match",
    [
        ("mxfp9", "unknown scheme kind 'mxfp9'"),
        ("mx:mod=floor", "bad field 'mod=floor'"),
        ("mx:mode", "bad field 'mode'"),
        ("mx:mode=flor", "'flor'"),
    ],
)
def test_from_spec_names_what_is_wrong(spec, match):
    from lowp._schemes import from_spec

    with pytest.raises(ValueError, match=match):
        from_spec(spec)


# --- the scheme protocol: what the frontends read off a scheme instead of its class ---

_EVERY_SCHEME = [
    lowp.TensorScaling(),
    lowp.TensorScaling("float4_e2m1fn", pow2=True),
    lowp.AxisScaling(axis=0, pow2=True),
    lowp.AxisScaling("float6_e3m2fn"),
    lowp.BlockScaling(block=(2, 4)),
    lowp.BlockScaling("float8_e5m2", block=(3, 5), pow2=True),
    lowp.MXScaling(mode="rceil"),
    lowp.MXScaling("float6_e2m3fn", block=2, mode="ceil", axis=0),
    lowp.NVFP4Scaling(),
    lowp.NVFP4Scaling(block=8, global_scale=False),
    lowp.GroupScaling(),
    lowp.GroupScaling("float4_e2m1fn", block=16, pow2=True),
    lowp.GroupScaling("float8_e5m2", block=2, axis=0),
]
_SHAPES = [(64,), (6, 32), (2, 3, 32), (2, 2, 2, 32), (0,), (6, 0), (2, 0, 32)]


def _admits(scheme, shape) -> bool:
    try:
        scheme.check_shape(shape)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("scheme", _EVERY_SCHEME, ids=str)
def test_spec_and_fields_round_trip(scheme):
    from lowp import extend
    from lowp._schemes import from_fields

    assert extend.from_spec(scheme.spec) == scheme
    assert scheme.spec.split(":")[0] == scheme.kind
    assert [p.split("=")[0] for p in scheme.spec.split(":")[1:]] == [
        f.name for f in dataclasses.fields(scheme)
    ]
    doc = scheme.to_fields(3)
    assert list(doc) == ["kind", *scheme.json_types()]
    expected = dataclasses.replace(scheme, axis=doc["axis"]) if "axis" in doc else scheme
    assert from_fields(doc) == expected
    assert extend.scale_format(scheme) == scheme.scale_format
    assert scheme.family in ("float", "mx", "nvfp4")


def test_spec_spells_every_field():
    assert lowp.MXScaling(mode="rceil").spec == "mx:fmt=float8_e4m3fn:block=32:mode=rceil:axis=-1"
    assert (
        lowp.BlockScaling(block=(1, 128)).spec == "block:fmt=float8_e4m3fn:block=1x128:pow2=false"
    )
    assert lowp.NVFP4Scaling().spec == "nvfp4:block=16:global_scale=true:axis=-1"


@pytest.mark.parametrize("scheme", _EVERY_SCHEME, ids=str)
def test_tiles_give_the_scale_shape(scheme):
    for shape in _SHAPES:
        if not _admits(scheme, shape):
            continue
        tiles = scheme.tiles(len(shape))
        groups = tuple(1 if t is None else -(-n // t) for n, t in zip(shape, tiles, strict=True))
        expected = scheme.scale_shape(shape)  # a tensorwise scale is 0-d: one group
        assert groups == expected or (expected == () and set(groups) <= {1}), (shape, tiles)


def _group_ids(scheme, shape) -> np.ndarray:
    from lowp import extend

    count = math.prod(scheme.scale_shape(shape))
    ids = np.arange(count).reshape(scheme.scale_shape(shape))
    return np.broadcast_to(extend.expand_groups(ids, scheme, shape), shape)


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two group-id arrays group the same elements together."""
    pairs = set(zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(), strict=True))
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


@pytest.mark.parametrize("scheme", _EVERY_SCHEME, ids=str)
def test_permuted_groups_the_permuted_tensor_alike(scheme):
    import itertools

    shape = (2, 4, 32)
    if not _admits(scheme, shape):
        return
    ids = _group_ids(scheme, shape)
    for dims in itertools.permutations(range(3)):
        moved = scheme.permuted(dims)
        if moved is None:  # fp4 off the last axis, or a block tile into the batch dims
            assert (scheme.fmt == "float4_e2m1fn" and dims[-1] != 2) or scheme.kind == "block"
            continue
        new_shape = tuple(shape[d] for d in dims)
        assert _same_partition(ids.transpose(dims), _group_ids(moved, new_shape)), dims


@pytest.mark.parametrize("scheme", _EVERY_SCHEME, ids=str)
def test_reshaped_and_selected_keep_the_groups(scheme):
    old, new = (2, 4, 32), (8, 32)
    if not _admits(scheme, old):
        return
    moved = scheme.reshaped(old, new)
    if moved is not None:
        assert _same_partition(_group_ids(scheme, old).reshape(new), _group_ids(moved, new))
    rank = len(old)
    for dim in range(rank):
        picked = scheme.selected(dim, rank)
        if picked is None or not _admits(picked, old[:dim] + old[dim + 1 :]):
            continue
        part = np.take(_group_ids(scheme, old), 1, axis=dim)
        assert _same_partition(part, _group_ids(picked, part.shape)), dim


def test_group_scaling_of_a_whole_axis_is_axis_scaling():
    """GroupScaling is the float-scale arithmetic on MX's groups: one group spanning
    the axis gives AxisScaling's bytes."""
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for pow2 in (False, True):
        by_axis = lowp.quantize(x, lowp.AxisScaling(pow2=pow2))
        by_group = lowp.quantize(x, lowp.GroupScaling(block=64, pow2=pow2))
        assert np.array_equal(by_axis.codes, by_group.codes)
        assert np.array_equal(by_axis.scale, by_group.scale)
    assert lowp.GroupScaling(block=16).scale_shape((4, 64)) == (4, 4)
    with pytest.raises(ValueError, match="does not divide"):
        lowp.GroupScaling(block=24).check_shape((4, 64))
    with pytest.raises(ValueError, match="last axis"):
        lowp.GroupScaling("float4_e2m1fn", block=2, axis=0).check_shape((4, 64))
