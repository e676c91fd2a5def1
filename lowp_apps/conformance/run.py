"""Running the plan: one case checked, or a whole plan on several backends, counted.

`check` is the one comparison every test and the CLI go through: the NumPy reference
quantizes the input, the backend quantizes and dequantizes it, and `compare` lists the
differences. `run_plan` counts cases and mismatches per scheme kind and backend (the
matrix `lowp conformance` prints) and keeps the first mismatches in full.
"""

import dataclasses
import time

import numpy as np

import lowp
from lowp_apps.conformance import cases, compare, grouped

MAX_RECORDED = 50  # mismatches kept in full per backend; all are counted
ROWS = (*cases.KINDS, "grouped")  # the matrix rows: scheme kinds, then MoE grouped operands


def check(backend, config: cases.Configuration, x: np.ndarray) -> list[str]:
    """How `backend` differs from the reference on input `x` of `config` ([]: identical).

    Args:
      backend: one of `backends.BACKENDS` (or any object with their `run` method).
      config: the configuration; its scheme, rounding and extras apply.
      x: the input, shaped config.shape, of dtype config.hp_dtype (a NumPy array).

    >>> import lowp
    >>> from lowp_apps.conformance import backends, cases
    >>> config = cases.Configuration(lowp.MXScaling(block=8, mode="rceil"), (2, 16))
    >>> check(backends.get("numpy"), config, cases.make_input("ties", (2, 16), config.scheme))
    []
    """
    ref = lowp.quantize(x, config.scheme, **config.rounding_kwargs())
    return compare.differences(x, ref, backend.run(config, x, ref))


def plan_size(size: str, backend) -> str:
    """The plan a backend runs for `size`: one smaller where each compile takes seconds."""
    if size not in cases.SIZES:
        raise ValueError(f"unknown conformance size {size!r}; expected one of {cases.SIZES}")
    if backend.slow_compile and size != "thin":
        return cases.SIZES[cases.SIZES.index(size) - 1]
    return size


@dataclasses.dataclass
class Cell:
    """Counts for one scheme kind on one backend."""

    cases: int = 0
    mismatches: int = 0
    errors: int = 0

    @property
    def passed(self) -> bool:
        return self.mismatches == 0 and self.errors == 0


@dataclasses.dataclass
class BackendRun:
    """One backend's run of a plan."""

    name: str
    description: str
    plan: str
    cells: dict  # scheme kind -> Cell
    failures: list  # {"configuration", "edge_case", "problems" or "error"}, the first MAX_RECORDED
    seconds: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cells.values())


def run_backend(backend, size: str, progress=None) -> BackendRun:
    """Every case of the plan for `size` on `backend`. An exception in a case is counted
    as an error of that case (with its message) and the run goes on.

    progress(done, total), if given, is called after each configuration."""
    start = time.time()
    plan = plan_size(size, backend)
    configurations = cases.configurations(plan)
    cells = {kind: Cell() for kind in ROWS}
    failures: list = []
    for n, config in enumerate(configurations):
        cell = cells[config.kind]
        for edge, x in cases.inputs(config):
            where = {"configuration": config.id, "edge_case": edge}
            _run_case(cell, failures, lambda config=config, x=x: check(backend, config, x), where)
        if progress is not None:
            progress(n + 1, len(configurations))
    _run_grouped(backend, plan, cells["grouped"], failures)
    return BackendRun(backend.name, backend.describe(), plan, cells, failures, time.time() - start)


def _run_grouped(backend, plan: str, cell: Cell, failures: list) -> None:
    """The grouped operands of MoE GEMMs (`grouped`): one case a routing and recipe."""
    for case, recipe in grouped.cases(plan):
        where = {"configuration": f"grouped {recipe}", "edge_case": case.name}
        _run_case(
            cell,
            failures,
            lambda case=case, recipe=recipe: grouped.check(backend, case, recipe),
            where,
        )


def _run_case(cell: Cell, failures: list, check, where: dict) -> None:
    """One case into its cell: `check()` returns its problems (empty if none); a
    mismatch or a crash is counted, and the first MAX_RECORDED are kept with `where`."""
    cell.cases += 1
    try:
        problems = check()
    except Exception as err:  # noqa: BLE001 - a crash is a failed case, reported
        cell.errors += 1
        record = {"error": f"{type(err).__name__}: {err}"[:2000]}
    else:
        if not problems:
            return
        cell.mismatches += 1
        record = {"problems": problems}
    if len(failures) < MAX_RECORDED:
        failures.append({**where, **record})
