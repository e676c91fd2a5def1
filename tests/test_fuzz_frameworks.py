"""Seeded property fuzzing across the backends: random schemes, formats, shapes, dtypes,
magnitudes and special values, quantized by every backend this machine has and compared
byte for byte with the NumPy reference (issue 23 item 9).

Each case `i` of generator `g` is drawn from `np.random.default_rng((SEED, g, i))`, so a
failure names the seed, generator and index that reproduce it. The default tier runs each
backend for FAST_SECONDS, the slow tier for SLOW_SECONDS (bounded for CI, where three
backends run on a CPU); `LOWP_FUZZ_SECONDS=600` runs either that long per backend and
`LOWP_FUZZ_SEED` changes the seed.

A new surface is fuzzed the same way by adding a generator to GENERATORS: a function
rng -> (cases.Configuration, input array) whose shape the scheme admits.
"""

import dataclasses
import os
import time

import numpy as np
import pytest

import lowp
from lowp import extend
from lowp_apps.conformance import backends, cases, run

SEED = int(os.environ.get("LOWP_FUZZ_SEED", "20261202"))
FAST_SECONDS, SLOW_SECONDS = 1.5, 20.0
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-39, 3e38, -1e38, 448.0])


def random_scheme(rng: np.random.Generator, rank: int) -> lowp.Scheme:
    """Any scheme class with random fields that make sense at `rank`."""
    fmt = str(rng.choice(list(lowp.ELEMENT_FORMATS)))
    axis = int(rng.integers(-rank, rank))
    pow2 = bool(rng.integers(2))
    kinds = ["tensor", "axis", "mx", "nvfp4", "group"] + (["block"] if rank >= 2 else [])
    kind = str(rng.choice(kinds))
    if kind == "tensor":
        return lowp.TensorScaling(fmt, pow2=pow2)
    if kind == "axis":
        return lowp.AxisScaling(fmt, axis=axis, pow2=pow2)
    if kind == "block":
        return lowp.BlockScaling(fmt, block=(int(rng.integers(1, 5)), int(rng.integers(1, 9))))
    if kind == "mx":
        block = int(rng.choice([2, 4, 8, 16, 32]))
        return lowp.MXScaling(fmt, block=block, mode=str(rng.choice(extend.MX_MODES)), axis=axis)
    if kind == "nvfp4":
        return lowp.NVFP4Scaling(block=int(rng.choice([8, 16])), global_scale=bool(pow2), axis=axis)
    return lowp.GroupScaling(fmt, block=int(rng.choice([2, 4, 16])), axis=axis, pow2=pow2)


def random_shape(rng: np.random.Generator, scheme, rank: int) -> tuple[int, ...]:
    """Dims of 1-6 (one of 0 now and then), whole blocks along a blocked axis, an even last
    dim for fp4 (two codes a byte)."""
    shape = [int(n) for n in rng.integers(1, 7, size=rank)]
    block = getattr(scheme, "block", None)
    if isinstance(block, int) and not isinstance(scheme, lowp.GroupScaling):
        shape[scheme.axis % rank] = block * int(rng.integers(1, 3))
    if rng.random() < 0.05:
        shape[int(rng.integers(rank))] = 0
    if scheme.fmt == "float4_e2m1fn" and shape[-1] % 2:
        shape[-1] += 1
    return tuple(shape)


def _configuration(rng, rank_low=1) -> cases.Configuration:
    for _ in range(100):
        rank = int(rng.integers(rank_low, 5))
        scheme = random_scheme(rng, rank)
        shape = random_shape(rng, scheme, rank)
        try:
            scheme.check_shape(shape)
        except ValueError:
            continue  # e.g. a GroupScaling block that does not divide its axis
        hp_dtype = str(rng.choice(list(cases.HP_DTYPES)))
        rounding = str(rng.choice(["nearest", "stochastic"]))
        return cases.Configuration(scheme, shape, hp_dtype, rounding)
    raise AssertionError("no admissible shape in 100 draws")


def _cast(x: np.ndarray, hp_dtype: str) -> np.ndarray:
    with np.errstate(over="ignore"):  # past float16's range: Inf, one more edge case
        return x.astype(cases.HP_DTYPES[hp_dtype])


def magnitudes(rng: np.random.Generator):
    """Magnitudes over 1e-30 .. 1e30, per element or per run of a block."""
    config = _configuration(rng)
    chunk = getattr(config.scheme, "block", None)
    chunk = chunk if isinstance(chunk, int) and rng.random() < 0.5 else None
    x = cases.random_magnitudes(config.shape, int(rng.integers(2**32)), chunk)
    return config, _cast(x, config.hp_dtype)


def specials(rng: np.random.Generator):
    """Normal values with NaN, Inf, signed zeros, subnormals and huge values dropped in."""
    config = _configuration(rng)
    x = (rng.standard_normal(config.shape) * 10.0 ** rng.uniform(-5, 5)).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size:
        where = rng.integers(flat.size, size=int(rng.integers(1, 4)))
        flat[where] = rng.choice(SPECIALS, size=where.size)
    return config, _cast(x, config.hp_dtype)


def odd_layouts(rng: np.random.Generator):
    """Transposed and strided inputs: the same values, another memory order."""
    config, x = magnitudes(rng)
    if x.ndim >= 2:
        x = np.ascontiguousarray(np.swapaxes(x, 0, 1)).swapaxes(0, 1)
    return config, x


GENERATORS = [magnitudes, specials, odd_layouts]


@dataclasses.dataclass
class Tally:
    cases: int = 0
    failures: list = dataclasses.field(default_factory=list)


def fuzz(backend, seconds: float) -> Tally:
    """Cases from GENERATORS in turn until `seconds` pass (at least one of each), the
    clock started after the first case (a backend's one-time warm-up)."""
    tally, start, index = Tally(), 0.0, 0
    while index < len(GENERATORS) or time.monotonic() - start < seconds:
        if index == 1:
            start = time.monotonic()
        g = index % len(GENERATORS)
        generator = GENERATORS[g]
        config, x = generator(np.random.default_rng((SEED, g, index)))
        where = f"seed=({SEED}, {g}, {index}) {generator.__name__} {config.id}"
        try:
            problems = run.check(backend, config, x)
        except Exception as err:  # noqa: BLE001 - any exception is a finding, named
            problems = [f"raised {type(err).__name__}: {err}"]
        if problems:
            tally.failures.append(f"{where}: " + "; ".join(problems)[:500])
        tally.cases += 1
        index += 1
    return tally


def _backend(name):
    found = backends.get(name)
    if (why := found.problem()) is not None:
        pytest.skip(f"{name}: {why}")
    return found


def _seconds(default: float) -> float:
    return float(os.environ.get("LOWP_FUZZ_SECONDS", default))


@pytest.mark.parametrize("name", backends.NAMES)
def test_fuzzed_cases_match_the_reference(name):
    tally = fuzz(_backend(name), _seconds(FAST_SECONDS))
    assert not tally.failures, f"{len(tally.failures)} of {tally.cases}:\n" + "\n".join(
        tally.failures[:10]
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", backends.NAMES)
def test_fuzzed_cases_match_the_reference_for_longer(name):
    tally = fuzz(_backend(name), _seconds(SLOW_SECONDS))
    assert not tally.failures, f"{len(tally.failures)} of {tally.cases}:\n" + "\n".join(
        tally.failures[:10]
    )
