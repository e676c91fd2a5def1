"""Every backend against the NumPy reference, byte for byte, on the same cases.

The cases are lowp_apps.conformance.cases' plans: every scheme x element format x rank 1-4
x edge case of spec §6 (zeros, NaN/Inf placement, ties, powers of two, subnormals,
huge and tiny maxima, partial block tiles, empty tensors), float32 / bfloat16 /
float16 inputs, nearest and seeded stochastic rounding. Every backend runs the quick
plan; eager torch, which pays nothing per configuration, runs the full one (which
contains every quick case); torch.compile, which pays seconds per configuration, the
thin one. One test per backend x rank x scheme; a failure lists the first differences
of each failing case: the element, its input bits and both outputs.

The spec §7 GEMM checks of every backend are here too: every path of every preset and
recipe GEMM against the float64 product of the reference's dequantized operands.
"""

import numpy as np
import pytest

from lowp_apps.conformance import backends, cases, gemm, run

# The plan each backend runs in the fast tier, and the larger one the slow tier adds:
# eager torch pays nothing per configuration, JAX on CPU compiles each (seconds), and
# torch.compile (`plan_size`) one size smaller again.
FAST_SIZE = {"jax_cpu": "thin", "jax_gpu": "thin"}
SLOW_SIZE = {"torch_cpu": "full", "torch_cuda_eager": "full"}


def _grid():
    """[(backend name, (rank, scheme), configurations, slow)] for every backend's plans:
    the fast plan's groups, then the configurations only the slow plan has."""
    grid = []
    for backend in backends.BACKENDS:
        fast = cases.configurations(run.plan_size(FAST_SIZE.get(backend.name, "quick"), backend))
        slow = cases.configurations(run.plan_size(SLOW_SIZE.get(backend.name, "quick"), backend))
        for configs, is_slow in ((fast, False), ([c for c in slow if c not in fast], True)):
            groups = {}
            for config in configs:
                groups.setdefault((len(config.shape), config.scheme), []).append(config)
            grid += [(backend.name, key, group, is_slow) for key, group in groups.items()]
    return grid


GRID = _grid()


@pytest.mark.parametrize(
    "backend, configs",
    [
        pytest.param(
            name,
            configs,
            id=f"{name}-r{rank}-{cases.scheme_id(scheme)}{'-slow' if is_slow else ''}",
            marks=[pytest.mark.slow] if is_slow else [],
        )
        for name, (rank, scheme), configs, is_slow in GRID
    ],
    indirect=["backend"],
)
def test_backend_matches_reference(backend, configs):
    failures = []
    for config in configs:
        for edge, x in cases.inputs(config):
            problems = run.check(backend, config, x)
            if problems:
                failures.append(f"{config.id} [{edge}]:\n  " + "\n  ".join(problems))
    assert not failures, f"{len(failures)} case(s) differ:\n" + "\n".join(failures[:8])


def test_every_plan_covers_every_scheme_format_and_rank():
    """The quick plan has every (rank, scheme) of schemes_for_rank, every input dtype and
    rounding, and empty shapes; the thin one every scheme kind with every format; the
    full one every quick case's (scheme, shape, dtype, rounding)."""
    quick = cases.configurations("quick")
    every = {(r, s) for r in cases.SHAPES for s in cases.schemes_for_rank(r)}
    assert {(len(c.shape), c.scheme) for c in quick} == every
    assert {(c.hp_dtype, c.rounding) for c in quick} == set(cases.INPUTS)
    assert any(0 in c.shape for c in quick) and any(c.extras for c in quick)
    thin = cases.configurations("thin")
    assert {(c.kind, c.scheme.fmt) for c in thin} >= {
        (k, f) for k in ("tensor", "axis", "block", "mx") for f in cases.ELEMENTS
    }
    assert {c.scheme.mode for c in thin if c.kind == "mx"} == set(cases.MX_MODES)
    full = {(c.scheme, c.shape, c.hp_dtype, c.rounding) for c in cases.configurations("full")}
    assert {(c.scheme, c.shape, c.hp_dtype, c.rounding) for c in quick} <= full
    with pytest.raises(ValueError, match="unknown conformance size 'huge'"):
        cases.configurations("huge")


def test_inputs_hold_every_edge_case_in_the_configurations_dtype():
    config = cases.Configuration(cases.schemes_for_rank(2)[0], cases.SHAPES[2], "bfloat16")
    named = dict(cases.inputs(config))
    assert {n.split("#")[0] for n in named} == set(cases.EDGE_CASES) | {"hp_patterns"}
    assert all(
        x.dtype == cases.HP_DTYPES["bfloat16"] and x.shape == (6, 32) for x in named.values()
    )
    assert np.isnan(named["nan"].astype(np.float32)).sum() == 1
    empty = cases.Configuration(cases.schemes_for_rank(2)[0], cases.EMPTY_SHAPES[2])
    assert [name for name, _ in cases.inputs(empty)] == ["empty"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend, case",
    [
        pytest.param(name, c, id=f"{name}-{c.id}")
        for name in backends.NAMES
        for c in gemm.gemm_cases()
    ],
    indirect=["backend"],
)
def test_gemm_paths_against_the_float64_product(backend, case):
    """Spec §7 on every path the backend has: SQNR >= 40 dB, and the elementwise bound
    without fast accumulation. Paths that cannot run here say why (-rs shows it)."""
    a, b = gemm.operands(case)
    a64, b64 = gemm.exact_operands(case, a, b)
    paths = backend.gemm_paths(case, a, b)
    if not paths:
        pytest.skip(
            f"{backend.name} has no GEMM: it is the reference the others are checked against"
        )
    failures = [
        f"{p.path}: {msg}"
        for p in paths
        if p.y is not None
        for msg in gemm.problems(p.y, a64, b64, p.bounded)
    ]
    assert not failures, "\n".join(failures)
    ran = [p.path for p in paths if p.y is not None]
    assert ran, "no path could run: " + "; ".join(f"{p.path}: {p.reason}" for p in paths)
