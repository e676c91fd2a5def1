"""Every grouped operand of the MoE GEMMs (spec §10) is the same bytes on every backend:
the routings of `lowp_apps.conformance.grouped` (empty experts, one token, all tokens in
one expert, sizes off multiples of 16/32/128, NaN/Inf in one expert) under each recipe,
against `lowp.extend.quantize_grouped`. `lowp conformance` runs the same cases."""

import numpy as np
import pytest

from lowp_apps.conformance import backends, grouped

FAST_CASE = grouped.CASES[1]  # empty experts and sizes off every block


def _params(fast: bool):
    out = []
    for name in backends.NAMES:
        for case, recipe in grouped.cases("full"):
            is_fast = case == FAST_CASE and name in ("numpy", "torch_cpu", "jax_cpu")
            if is_fast == fast:
                out.append(pytest.param(name, case, recipe, id=f"{name}-{case.name}-{recipe}"))
    return out


@pytest.mark.parametrize("backend,case,recipe", _params(fast=True), indirect=["backend"])
def test_grouped_operands(backend, case, recipe):
    assert grouped.check(backend, case, recipe) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend,case,recipe", _params(fast=False), indirect=["backend"])
def test_grouped_operands_every_case(backend, case, recipe):
    assert grouped.check(backend, case, recipe) == []


def test_poison_stays_in_its_expert():
    """The NaN case poisons the scales of its expert's groups only (the reference)."""
    case = next(c for c in grouped.CASES if c.name == "nan_one_expert")
    arrays = grouped.inputs(case)
    ref = grouped.reference(arrays, np.array(case.sizes), "float8_rowwise")
    x_t_scale = ref["wgrad"][1][1].view(np.float32)  # (K, E): expert 1 holds row 30
    assert np.isnan(x_t_scale[5]).tolist() == [False, True, False]
    assert not np.isnan(np.delete(x_t_scale, 5, axis=0)).any()


def test_a_wrong_byte_is_named():
    class OffByOne:
        def grouped_operands(self, arrays, sizes, recipe):
            ops = grouped.reference(arrays, sizes, recipe)
            (codes, scale), b = ops["wgrad"]
            codes = codes.copy()
            codes[0, 3] ^= 1
            ops["wgrad"] = ((codes, scale), b)
            return ops

    problems = grouped.check(OffByOne(), grouped.CASES[0], "mxfp8")
    assert len(problems) == 1, problems
    assert problems[0].startswith("wgrad a codes: 1 bytes differ, the first at (0, 3)")
