"""The suite catches a wrong rounding detail in any backend.

Each test monkeypatches one detail — the MX exponent choice rceil -> floor, the element
encoder's round-to-nearest-even -> truncation, the flush of float32 subnormals dropped —
in the NumPy core, lowp_torch or lowp_jax (the library ships no switch for any of
this), runs one conformance case that the detail decides, and asserts that
`run.check`, the comparison every conformance test and `lowp conformance` use, reports
the difference with the element, its input bits and both outputs; the same case
passes before the mutation, so the mutation is what was caught.

A mutated NumPy core is the reference itself, so it shows as the other backends
disagreeing with it. jax caches what it traced, so the jax tests clear its caches
around the mutation.
"""

import contextlib
import re

import numpy as np
import pytest

import lowp
from lowp import _bits, _quantize, _rounding
from lowp_apps.conformance import cases, run

MX_RCEIL = cases.Configuration(
    lowp.MXScaling("float8_e4m3fn", block=8, mode="rceil"), cases.SHAPES[2]
)
TENSOR = cases.Configuration(lowp.TensorScaling("float8_e4m3fn"), cases.SHAPES[2])
DESCRIBED = re.compile(
    r"first at index \(.*\): got 0x[0-9a-f]+, want 0x[0-9a-f]+; .*= 0x[0-9a-f]+ \("
)


def _assert_caught(backend, config, edge, mutation, field, clear=contextlib.nullcontext):
    """`mutation()` patches the backend (undone after); the case `edge` of `config` must
    pass before it and differ in `field` under it, the difference fully described."""
    x = dict(cases.inputs(config))[edge]
    assert run.check(backend, config, x) == [], "the case must pass unmutated"
    with pytest.MonkeyPatch.context() as patch, clear():
        mutation(patch)
        problems = run.check(backend, config, x)
    caught = [p for p in problems if p.startswith(field)]
    assert caught, f"no difference in {field}: {problems}"
    assert all(DESCRIBED.search(p) for p in caught), caught


def _rceil_as_floor(original):
    """An MX scale-byte function that computes rceil as floor (other modes unchanged)."""

    def mutated(amax_bits, fmt, mode):
        return original(amax_bits, fmt, "floor" if mode == "rceil" else mode)

    return mutated


@contextlib.contextmanager
def _fresh_jax_traces():
    """Retrace under the mutation, and drop the mutated traces afterwards."""
    import jax

    jax.clear_caches()
    try:
        yield
    finally:
        jax.clear_caches()


# --- the NumPy core (the reference) --------------------------------------------------------

# The pow2 edge case puts group maxima just above max * 2**k, where rceil rounds up and
# floor does not.


@pytest.mark.parametrize("backend", ["torch_cpu", "jax_cpu"], indirect=True)
def test_numpy_rceil_as_floor_is_caught(backend):
    def mutation(patch):
        patch.setattr(_quantize, "mx_scale_bytes", _rceil_as_floor(_quantize.mx_scale_bytes))

    _assert_caught(backend, MX_RCEIL, "pow2#0", mutation, "scale")


@pytest.mark.parametrize("backend", ["torch_cpu", "jax_cpu"], indirect=True)
def test_numpy_encoder_truncating_is_caught(backend):
    original = _rounding.nearest_codes  # what quantize calls (after its clamp)

    def truncating(v, fmt, scratch=None):
        keep = np.uint32(0xFFFFFFFF) << np.uint32(23 - fmt.mbits)
        return original(_bits.from_bits(_bits.bits(v) & keep), fmt, scratch)

    _assert_caught(
        backend,
        TENSOR,
        "random",
        lambda p: p.setattr(_rounding, "nearest_codes", truncating),
        "codes",
    )


# --- lowp_torch ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch_cpu", "torch_cuda_eager"], indirect=True)
def test_torch_encoder_truncating_is_caught(backend):
    from lowp_torch import _bits as torch_bits
    from lowp_torch import _encode

    original, original_on_host = _encode.encode, _encode.float8_codes_on_host

    def truncated(v, fmt):
        keep = -(1 << (23 - fmt.mbits))  # int32 mask clearing the bits below fmt's mantissa
        return torch_bits.from_bits(torch_bits.bits(v) & keep)

    def mutation(patch):  # the whole-tensor encoder, and the eager CPU slabs' float8 cast
        patch.setattr(_encode, "encode", lambda v, fmt: original(truncated(v, fmt), fmt))
        patch.setattr(
            _encode,
            "float8_codes_on_host",
            lambda v, fmt, scratch, out: original_on_host(truncated(v, fmt), fmt, scratch, out),
        )

    _assert_caught(backend, TENSOR, "random", mutation, "codes")


@pytest.mark.parametrize("backend", ["torch_cpu", "torch_cuda_eager"], indirect=True)
def test_torch_dropped_flush_is_caught(backend):
    from lowp_torch import _bits as torch_bits

    # Only float32 subnormals: flushed, every code is a zero; kept, MX scales them up
    # by 2**127 into nonzero codes.
    _assert_caught(
        backend,
        MX_RCEIL,
        "only_subnormals",
        lambda p: p.setattr(torch_bits, "ftz", lambda x: x),
        "codes",
    )


# --- lowp_jax ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax_cpu", "jax_gpu"], indirect=True)
def test_jax_rceil_as_floor_is_caught(backend):
    from lowp_jax import _quantize as jax_quantize

    def mutation(patch):
        patch.setattr(
            jax_quantize, "_mx_scale_bytes", _rceil_as_floor(jax_quantize._mx_scale_bytes)
        )

    _assert_caught(backend, MX_RCEIL, "pow2#0", mutation, "scale", clear=_fresh_jax_traces)


@pytest.mark.parametrize("backend", ["jax_cpu", "jax_gpu"], indirect=True)
def test_jax_dropped_flush_is_caught(backend):
    from lowp_jax import _bits as jax_bits

    # XLA on a CPU flushes subnormal operands of float ops by itself, so the explicit
    # flush shows where an integer path reads the bits: NVFP4's tensor max, whose
    # subnormal value would give S_enc = FLT_MAX and a global scale of 0, not 1.
    _assert_caught(
        backend,
        cases.Configuration(lowp.NVFP4Scaling(), cases.SHAPES[2]),
        "only_subnormals",
        lambda p: p.setattr(jax_bits, "ftz_bits", lambda b: b),
        "global_scale",
        clear=_fresh_jax_traces,
    )
