"""lowp_jax's scoped switches (`cast_kernels`, `gemm_output`, both `_switches.Switch`):
refused values, nesting, blocks of several threads, and jit's caches keyed on them."""

import threading

import jax
import jax.numpy as jnp
import pytest

import lowp
import lowp_jax
from lowp_jax import _devices, _dot, _pallas_cast, _quantize, _switches


def test_unknown_values_are_refused():
    with pytest.raises(ValueError, match="'pallas'"), lowp_jax.cast_kernels("pallas"):
        pass
    with pytest.raises(ValueError, match="'bfloat16'"), lowp_jax.gemm_output("bfloat16"):
        pass
    with pytest.raises(ValueError, match="-1"), lowp_jax.gemm_output(bf16_min_macs=-1):
        pass
    assert _pallas_cast._KERNELS.value == ("auto", True)


def test_the_setting_is_restored_after_the_block():
    with lowp_jax.gemm_output("float32"):
        with lowp_jax.gemm_output("auto", bf16_min_macs=0):
            assert _dot._GEMM_OUTPUT.value == ("auto", 0)
        assert _dot._GEMM_OUTPUT.value == ("float32", _dot.BF16_OUTPUT_MIN_MACS)
    assert _dot._GEMM_OUTPUT.value == ("auto", _dot.BF16_OUTPUT_MIN_MACS)
    with pytest.raises(RuntimeError), lowp_jax.cast_kernels("xla"):
        raise RuntimeError
    assert _pallas_cast._KERNELS.value == ("auto", True)


def test_blocks_of_two_threads_may_exit_in_any_order():
    """Thread A opens "a", thread B opens "b", A exits first: B's block still holds "b",
    in A's thread too (restoring A's saved default would end it early), and after both,
    the default."""
    switch = _switches.Switch("default")
    steps = [threading.Event() for _ in range(4)]
    seen = []

    def thread_a():
        with switch.setting("a"):
            steps[0].set()
            steps[1].wait()
        seen.append(("a exited", switch.value))
        steps[2].set()

    def thread_b():
        steps[0].wait()
        with switch.setting("b"):
            steps[1].set()
            steps[2].wait()
            seen.append(("b open", switch.value))

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert seen == [("a exited", "b"), ("b open", "b")]
    assert switch.value == "default"


def test_a_jitted_function_is_traced_again_under_another_cast_setting(monkeypatch):
    """The setting is part of jit's key: the quantizer jitted inside lowp_jax and a
    caller's jit both retrace under "xla" instead of reusing the kernel's trace, and
    return to it after the block. (The machine is faked sm_90, so the kernel applies;
    the traces made so are dropped after.)"""
    monkeypatch.setattr(_devices, "sm90_gpus", lambda: True)
    x = jnp.ones((24, 40), jnp.bfloat16)
    quantize = jax.jit(lambda x: lowp_jax.quantize(x, lowp.TensorScaling()).codes)

    def kernel_traced():
        return "lowp_float8_cast" in str(quantize.trace(x).jaxpr)

    try:
        assert kernel_traced()
        with lowp_jax.cast_kernels("xla"):
            assert not kernel_traced()
        assert kernel_traced()
    finally:
        _quantize._quantize.clear_cache()


def test_a_jitted_function_is_traced_again_under_another_gemm_output():
    """The bfloat16 form at any size, then float32 inside it, then the default: each
    a trace of its own from one jitted function."""
    x = jnp.full((2, 8), 3.0, jnp.bfloat16)

    @jax.jit
    def dot(x):
        dims = (((1,), (1,)), ((), ()))
        return lowp_jax.dot_general(x, x, dims, config="float8_tensorwise", impl="fp8")

    def written():  # what the fp8 dot writes
        return "preferred_element_type=bfloat16" in str(dot.trace(x).jaxpr)

    assert not written()
    with lowp_jax.gemm_output("auto", bf16_min_macs=0):
        assert written()
        with lowp_jax.gemm_output("float32"):
            assert not written()
    assert not written()
