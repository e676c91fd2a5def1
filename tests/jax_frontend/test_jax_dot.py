"""lowp_jax.dot_general: every branch against the float64 product of its dequantized
operands (spec §7), layouts, gradients, zeros and NaN, errors, and (on a GPU) the fp8
GEMM in the compiled HLO.

Calls are eager (quantize and dequantize are jitted inside and cached per scheme and
shape), so the parametrized cases share compilations and stay fast on CPU.
"""

import functools
import re

import jax
import jax.numpy as jnp
import jax_dot_cases as C
import ml_dtypes
import numpy as np
import pytest

import lowp
import lowp_jax

DIMS = {rank: (((rank - 1,), (1,)), ((), ())) for rank in C.SHAPES}  # x (..., K) · w (N, K)
ON_GPU = jax.default_backend() == "gpu"


def _reference(x, w, config):
    a64 = C.dequantized(x, config.activation)
    b64 = C.dequantized(w, config.weight)
    return a64, b64, C.exact_product(a64, b64)


# Every preset at rank 2-4 in float32; bfloat16 operands for one preset of each kind of
# GEMM (fp8, block-scaled, dequantized), to keep the CPU run short.
CASES = [(p, rank, "float32") for p in C.PRESETS for rank in (2, 3, 4)] + [
    (p, 2, "bfloat16") for p in ("float8_rowwise", "float8_block", "nvfp4")
]


@pytest.mark.slow
@pytest.mark.parametrize("preset, rank, hp_dtype", CASES)
def test_every_impl_against_the_float64_product(preset, rank, hp_dtype):
    config = lowp.InferenceConfig.from_name(preset)
    dtype = np.float32 if hp_dtype == "float32" else ml_dtypes.bfloat16
    x, w = C.operands(C.SHAPES[rank], seed=rank, hp_dtype=dtype)
    a64, b64, exact = _reference(x, w, config)
    for impl in C.impls():
        if not C.runs(preset, impl):
            continue
        y = lowp_jax.dot_general(x, w, DIMS[rank], config=config, impl=impl)
        assert y.shape == exact.shape and y.dtype == dtype, impl
        db = C.sqnr_db(y, exact)
        assert db >= C.GEMM_SQNR_DB, f"{impl}: {db:.1f} dB"
        exact_f32 = impl == "emulated" or (hp_dtype == "float32" and not ON_GPU)
        if exact_f32:
            # Operands exact in float32, float32 accumulation, no fast accumulation: spec
            # §7's elementwise bound. ("dequantize" rounds operands to bfloat16 in a
            # bfloat16 model, and GPUs accumulate fp8 fast or float32 in TF32: SQNR only.)
            excess = np.abs(np.asarray(y, np.float64) - exact) - C.gemm_bound(
                a64, b64, exact, dtype
            )
            assert excess.max() <= 0, f"{impl}: exceeds the bound by {excess.max()}"


def test_a_preset_name_is_a_config():
    x, w = C.operands(C.SHAPES[2])
    by_name = lowp_jax.dot_general(x, w, DIMS[2], config="mxfp8")
    by_config = lowp_jax.dot_general(x, w, DIMS[2], config=lowp.InferenceConfig.from_name("mxfp8"))
    np.testing.assert_array_equal(np.asarray(by_name), np.asarray(by_config))
    with pytest.raises(ValueError, match="unknown inference preset 'mxfp9'"):
        lowp_jax.dot_general(x, w, DIMS[2], config="mxfp9")


@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8", "nvfp4"])
def test_layouts_give_the_same_product(preset):
    """(N, K) and flax's (K, N) weight, lhs contracted along another axis than the last,
    and QArray weights in either layout: all quantize along K and agree bit for bit."""
    config = lowp.InferenceConfig.from_name(preset)
    x, w = C.operands(C.SHAPES[2])
    want = lowp_jax.dot_general(x, w, DIMS[2], config=config)
    kn = lowp_jax.dot_general(x, w.T, (((1,), (0,)), ((), ())), config=config)
    km = lowp_jax.dot_general(x.T, w, (((0,), (1,)), ((), ())), config=config)
    qw = lowp_jax.quantize(w, config.weight)
    pre = lowp_jax.dot_general(x, qw, DIMS[2], config=config)
    qx = lowp_jax.quantize(x, config.activation)
    both = lowp_jax.dot_general(qx, qw, DIMS[2])
    for got in (kn, km, pre, both):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    if preset == "float8_rowwise":  # a (K, N) QArray quantized along K (axis 0) is transposed
        q_kn = lowp_jax.quantize(w.T, lowp.AxisScaling(axis=0))
        got = lowp_jax.dot_general(x, q_kn, (((1,), (0,)), ((), ())), config=config)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("preset", C.PRESETS)
def test_all_zero_rows_give_zeros_not_nan(preset):
    config = lowp.InferenceConfig.from_name(preset)
    x, w = C.operands(C.SHAPES[2])
    x = x.at[3].set(0.0)
    y = np.asarray(lowp_jax.dot_general(x, w, DIMS[2], config=config))
    assert np.isfinite(y).all()
    assert (y[3] == 0).all()
    zero = lowp_jax.dot_general(jnp.zeros_like(x), w, DIMS[2], config=config)
    assert (np.asarray(zero) == 0).all()


def test_nan_poisons_only_its_rows():
    config = lowp.InferenceConfig.from_name("float8_rowwise")
    x, w = C.operands(C.SHAPES[2])
    y = np.asarray(lowp_jax.dot_general(x.at[2, 7].set(jnp.nan), w, DIMS[2], config=config))
    assert np.isnan(y[2]).all() and np.isfinite(np.delete(y, 2, axis=0)).all()


@pytest.mark.parametrize("preset", ["float8_rowwise", "mxfp8", "float8_weight_only"])
def test_jit_and_straight_through_gradients(preset):
    """Under jit, d/dx of sum(x·w_q) is the dequantized weight summed over N (the input's
    quantization passes the gradient straight through); d/dw of a weight quantized at
    each call likewise; a QArray weight gets none. (Precision.HIGHEST: a GPU would
    otherwise run the float32 gradient dots in TF32.)"""
    config = lowp.InferenceConfig.from_name(preset)
    x, w = C.operands(C.SHAPES[3])
    qw = lowp_jax.quantize(w, config.weight)
    highest = jax.lax.Precision.HIGHEST

    def loss(x, w):
        return lowp_jax.dot_general(x, w, DIMS[3], highest, config=config).sum()

    gx = jax.jit(jax.grad(loss))(x, qw)
    want = np.broadcast_to(np.asarray(qw.dequantize()).sum(0), x.shape)
    np.testing.assert_allclose(np.asarray(gx), want, rtol=1e-6, atol=1e-6)
    gx_hp, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(np.asarray(gx_hp), want, rtol=1e-6, atol=1e-6)
    xq = C.dequantized(x, config.activation).reshape(-1, C.K).sum(0)
    np.testing.assert_allclose(np.asarray(gw), np.broadcast_to(xq, w.shape), rtol=1e-5, atol=1e-5)
    # Jitted and eager: the same quantized operands, accumulation order left to XLA (§7).
    y = jax.jit(lambda x: lowp_jax.dot_general(x, qw, DIMS[3], config=config))(x)
    eager = lowp_jax.dot_general(x, qw, DIMS[3], config=config)
    assert C.sqnr_db(y, eager) >= 60


@pytest.mark.parametrize("preset", ["mxfp8", "mxfp4", "nvfp4"])
def test_scaled_matmul_operands_stand_for_the_dequantized_values(preset):
    """What jax.nn.scaled_matmul receives (checked here on any backend; the kernel itself
    runs on Blackwell): element values times block scales times the global scales."""
    config = lowp.InferenceConfig.from_name(preset)
    x, _ = C.operands(C.SHAPES[3])
    q = lowp_jax.quantize(x, config.activation)
    data, scales = lowp_jax._dot.scaled_matmul_operands(q)
    block = config.activation.block
    assert data.shape == (1, 8, C.K) and scales.shape == (1, 8, C.K // block)
    values = np.asarray(data.astype(jnp.float32), np.float64)
    values *= np.repeat(np.asarray(scales.astype(jnp.float32), np.float64), block, axis=-1)
    if q.global_scale is not None:
        values *= float(q.global_scale)
    want = np.asarray(q.dequantize("float32"), np.float64).reshape(values.shape)
    np.testing.assert_allclose(values, want, rtol=2**-22, atol=0)


def test_the_choice_and_its_reason():
    config = lowp.InferenceConfig.from_name("mxfp8")
    x, w = C.operands(C.SHAPES[2])
    impl, reason = lowp_jax.dot_general_impl(x, w, DIMS[2], config=config)
    if ON_GPU:
        assert impl in ("scaled_matmul", "dequantize")
        assert impl == "scaled_matmul" or "compute capability" in reason
    else:
        assert (impl, reason) == (
            "emulated",
            f"the {jax.default_backend()} backend has no low-precision GEMM",
        )
        assert "CUDA" in lowp_jax.scaled_matmul_problem()
        with pytest.raises(ValueError, match="impl='scaled_matmul' cannot run.*CUDA"):
            lowp_jax.dot_general(x, w, DIMS[2], config=config, impl="scaled_matmul")
    block = lowp.InferenceConfig.from_name("float8_block")
    with pytest.raises(ValueError, match="impl='fp8' cannot run.*BlockScaling"):
        lowp_jax.dot_general(x, w, DIMS[2], config=block, impl="fp8")
    weight_only = lowp.InferenceConfig.from_name("float8_weight_only")
    with pytest.raises(ValueError, match="weight-only"):
        lowp_jax.dot_general(x, w, DIMS[2], config=weight_only, impl="fp8")


@functools.cache
def _bad_calls():
    rowwise = lowp.InferenceConfig.from_name("float8_rowwise")
    x, w = C.operands(C.SHAPES[2])
    qw = lowp_jax.quantize(w, rowwise.weight)
    along_n = lowp_jax.quantize(w, lowp.AxisScaling(axis=0))
    return [
        (
            "contracting dims differ: lhs dim 1 has size 256",
            (x, w[:, :128], DIMS[2]),
            {"config": rowwise},
        ),
        ("no batch dimensions", (x, w, (((1,), (1,)), ((0,), (0,)))), {"config": rowwise}),
        (
            "contracts exactly one dim of each operand",
            (x, w, (((0, 1), (0, 1)), ((), ()))),
            {"config": rowwise},
        ),
        (
            "rhs must be a rank-2 weight",
            (x, w[None], (((1,), (2,)), ((), ()))),
            {"config": rowwise},
        ),
        (
            "rhs: contracting dim 2 is out of range",
            (x, w, (((1,), (2,)), ((), ()))),
            {"config": rowwise},
        ),
        ("quantized along axis 0 .* contracts axis 1", (x, along_n, DIMS[2]), {"config": rowwise}),
        (
            "a QArray lhs must contract its last axis",
            (lowp_jax.quantize(x.T, lowp.AxisScaling(axis=0)), qw, (((0,), (1,)), ((), ()))),
            {},
        ),
        (
            "block 32 does not divide axis -1 of size 48",
            (x[:, :48], w[:, :48], DIMS[2]),
            {"config": lowp.InferenceConfig.from_name("mxfp8")},
        ),
        ("impl must be one of", (x, w, DIMS[2]), {"config": rowwise, "impl": "cublas"}),
    ]


@pytest.mark.parametrize("index", range(9))
def test_bad_shapes_and_arguments_raise_value_errors_naming_them(index):
    match, args, kwargs = _bad_calls()[index]
    with pytest.raises(ValueError, match=match):
        lowp_jax.dot_general(*args, **kwargs)


def test_type_errors():
    x, w = C.operands(C.SHAPES[2])
    with pytest.raises(TypeError, match="pass config="):
        lowp_jax.dot_general(x, w, DIMS[2])
    with pytest.raises(TypeError, match="float32/bfloat16/float16"):
        lowp_jax.dot_general(
            x.astype(jnp.int32), w, DIMS[2], config=lowp.InferenceConfig.from_name("mxfp8")
        )


_FP8_GEMM = "__cublas$lt$matmul$f8"  # XLA's kCublasLtMatmulF8CallTarget (gpu custom call)


HIGHEST, DEFAULT = jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT


def _fp8_dot_forms(
    pow2, precision, kind=lowp.TensorScaling, out_dtype=jnp.bfloat16, signed_weight=False
):
    """(a, b, lowp_jax's fp8 product of them, that product in the float32 form, its
    jaxpr) for bfloat16 operands quantized with `kind` (pow2 scales or not) at
    `precision`. The operands are non-negative, the worst case for spec §7's bound:
    its accumulation term is then smallest next to the output; with `signed_weight`,
    b is zero-mean, as a forward GEMM's weight is."""
    from lowp_jax import _dot

    # the dense layer's shape in test_fp8_dense_layer_compiles_to_cublaslt_fp8_gemm: on
    # the H200, XLA gives much smaller fp8 dots to Triton instead of cuBLASLt
    rng = np.random.default_rng(3)
    x = jnp.asarray(np.abs(rng.standard_normal((512, 1024))), jnp.bfloat16)
    w = rng.standard_normal((2048, 1024)) / 32
    w = jnp.asarray(w if signed_weight else np.abs(w), jnp.bfloat16)
    scheme = kind("float8_e4m3fn", pow2=pow2)
    a, b = lowp_jax.quantize(x, scheme), lowp_jax.quantize(w, scheme)

    def product(a, b):
        return _dot._fp8_dot(a, b, precision, out_dtype).astype(out_dtype)

    y = jax.jit(product)(a, b)
    with lowp_jax.gemm_output("float32"):
        y32 = jax.jit(product)(a, b)  # traced again: the setting is part of jit's key
    return a, b, y, y32, jax.make_jaxpr(product)(a, b)


def _written(jaxpr):
    (dot,) = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    return dot.params["preferred_element_type"]


def _excess_over_the_bound(a, b, y) -> float:
    """The largest |y - y_exact| past spec §7's elementwise bound (<= 0: within it)."""
    a64 = np.asarray(lowp_jax.dequantize(a, "float32"), np.float64)
    b64 = np.asarray(lowp_jax.dequantize(b, "float32"), np.float64)
    exact = a64 @ b64.T
    bound = C.ulp(exact, y.dtype) + a64.shape[-1] * 2.0**-23 * (np.abs(a64) @ np.abs(b64).T)
    return float((np.abs(np.asarray(y, np.float64) - exact) - bound).max())


@pytest.fixture
def bf16_form_at_any_size():
    """The tensorwise bfloat16 form down to the small dots a test can check against
    float64 (on the H200, XLA kept 512x1024x2048 on cuBLASLt at HIGHEST precision)."""
    with lowp_jax.gemm_output("auto", bf16_min_macs=0):
        yield


def test_power_of_two_tensorwise_scales_write_bfloat16_exactly(bf16_form_at_any_size):
    """Two tensorwise operands with power-of-two scales and a bfloat16 output, without
    fast accumulation: the fp8 dot writes bfloat16 times the scale in bfloat16, the form
    XLA folds into cuBLASLt's fp8 GEMM (`_dot._fp8_dot`), with the float32 form's bytes
    (a bfloat16 times a power of two is exact) and within spec §7's bound; on a GPU the
    compiled module runs one cuBLASLt fp8 GEMM writing bfloat16 and no float32 array."""
    from lowp_jax import _dot

    a, b, y, y32, jaxpr = _fp8_dot_forms(True, HIGHEST)
    assert _written(jaxpr) == jnp.bfloat16 and y.dtype == jnp.bfloat16
    assert np.array_equal(np.asarray(y, np.float32), np.asarray(y32, np.float32))
    if ON_GPU:
        assert _excess_over_the_bound(a, b, y) <= 0
        hlo = (
            jax.jit(lambda a, b: _dot._fp8_dot(a, b, HIGHEST, jnp.bfloat16))
            .lower(a, b)
            .compile()
            .as_text()
        )
        gemms = re.findall(r"= \(?(\w+)\[[^\n]*__cublas\$lt\$matmul\$f8", hlo)
        assert gemms == ["bf16"], gemms
        assert "f32[512,2048]" not in hlo, "a float32 array of the output's shape"


def test_fast_accumulation_writes_bfloat16_with_the_scale_rounded(bf16_form_at_any_size):
    """Fast accumulation (DEFAULT, a forward GEMM), scales no power of two: the bfloat16
    form too, its scale rounded to bfloat16 (up to 2**-8 of it), within spec §7's 40 dB,
    the only bound there, for a non-negative activation and a zero-mean weight.

    Not for two non-negative operands: Hopper's fast accumulator loses accuracy with K
    on products of one sign, in either form and in torch._scaled_mm alike. On the H200
    this test failed at 37.0 dB with them; bench/probes/gemm_accuracy.py measured 36.4 dB at
    this shape in the float32 form and 17.9 at K=16384 (docs/numerics.md §7)."""
    a, b, y, _, jaxpr = _fp8_dot_forms(False, DEFAULT, signed_weight=True)
    assert _written(jaxpr) == jnp.bfloat16
    a64 = np.asarray(lowp_jax.dequantize(a, "float32"), np.float64)
    b64 = np.asarray(lowp_jax.dequantize(b, "float32"), np.float64)
    assert C.sqnr_db(y, a64 @ b64.T) >= C.GEMM_SQNR_DB


@pytest.mark.parametrize(
    "kind, pow2, out_dtype",
    [
        (lowp.TensorScaling, False, jnp.bfloat16),  # the scale's rounding would pass the bound
        (lowp.AxisScaling, True, jnp.bfloat16),  # XLA folds no vector scales
        (lowp.TensorScaling, True, jnp.float32),
    ],
)
def test_other_fp8_dots_write_float32_and_scale_it(kind, pow2, out_dtype, bf16_form_at_any_size):
    """Without fast accumulation and scales no power of two, row / column scales, or an
    output other than bfloat16: the dot writes float32, the scales multiply it, and the
    output is rounded once (`_dot._gemm_output_form`), within spec §7's elementwise bound
    even for these non-negative operands."""
    a, b, y, _, jaxpr = _fp8_dot_forms(pow2, HIGHEST, kind, out_dtype)
    assert _written(jaxpr) == jnp.float32
    if out_dtype == jnp.bfloat16 or not ON_GPU:
        assert _excess_over_the_bound(a, b, y) <= 0
    else:  # float32's ulp: the GPU is held to 40 dB there, as in the test of every impl
        a64 = np.asarray(lowp_jax.dequantize(a, "float32"), np.float64)
        b64 = np.asarray(lowp_jax.dequantize(b, "float32"), np.float64)
        assert C.sqnr_db(y, a64 @ b64.T) >= C.GEMM_SQNR_DB


@pytest.mark.parametrize(
    "m, precision, written",
    [
        (8192, DEFAULT, jnp.bfloat16),
        (8191, DEFAULT, jnp.float32),
        (8192, HIGHEST, jnp.float32),  # scales no power of two, no fast accumulation
        (8192, "default", jnp.bfloat16),
        (8192, (DEFAULT, HIGHEST), jnp.float32),
    ],
)
def test_the_tensorwise_bfloat16_form_starts_at_its_size(m, precision, written):
    """From `_dot.BF16_OUTPUT_MIN_MACS` (2**39) multiply-adds up, and under fast
    accumulation (DEFAULT on both operands) for these scales; below it the float32 form,
    which XLA keeps on cuBLASLt at every size (traced, not run)."""
    from lowp_jax import _dot

    assert _dot.BF16_OUTPUT_MIN_MACS == 2**39
    scheme = lowp.TensorScaling("float8_e4m3fn")

    def product(x, w):
        a, b = lowp_jax.quantize(x, scheme), lowp_jax.quantize(w, scheme)
        return _dot._fp8_dot(a, b, precision, jnp.bfloat16)

    x = jax.ShapeDtypeStruct((m, 8192), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((8192, 8192), jnp.bfloat16)
    assert _written(jax.make_jaxpr(product)(x, w)) == written


@pytest.mark.skipif(
    not ON_GPU,
    reason="needs a CUDA GPU: the fp8 GEMM is XLA's cuBLASLt rewrite of an fp8 dot on sm_89+",
)
@pytest.mark.parametrize("preset", ["float8_tensorwise", "float8_rowwise"])
def test_fp8_dense_layer_compiles_to_cublaslt_fp8_gemm(preset):
    """The compiled float8 dense layer (pre-quantized (N, K) kernel, activation quantized
    in the same jit) calls cuBLASLt's fp8 GEMM, and no fp8 operand is transposed first."""
    from flax import nnx

    layer = lowp_jax.nnx.Linear(
        1024, 2048, config=preset, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)
    )
    nnx.update(layer, lowp_jax.quantize_params(nnx.state(layer), preset))
    graphdef, state = nnx.split(layer)
    x = jnp.ones((512, 1024), jnp.bfloat16)

    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    hlo = jax.jit(forward).lower(state, x).compile().as_text()
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo)))
    assert _FP8_GEMM in targets, f"no fp8 cuBLASLt GEMM; custom calls: {targets}"
    transposed = re.findall(r"f8e\w+\[[\d,]+\]\{[\d,]+\} (?:transpose|copy)\(", hlo)
    assert not transposed, f"an fp8 operand is transposed before the GEMM: {transposed}"
