"""The conformance matrix as text and as JSON: scheme kind x backend, cases and mismatches.

A cell reads `✓ N` (N cases, every one byte-identical to the reference) or `✗ M/N`
(M of N cases differ; `+E err` when E cases raised). The JSON carries the same counts
plus every backend's description and plan, the absent backends with the reason, and
the first recorded failures in full; backends not run say why (absent here, or not
asked for).
"""

import platform

import numpy as np

from lowp_apps.conformance import run

MARKS = {"pass": "✓", "fail": "✗"}
ASCII_MARKS = {"pass": "ok", "fail": "FAIL"}


def _cell_text(cell, marks) -> str:
    if cell.passed:
        return f"{marks['pass']} {cell.cases}"
    text = f"{marks['fail']} {cell.mismatches}/{cell.cases}"
    return text + (f" +{cell.errors} err" if cell.errors else "")


def _total(backend_run) -> "run.Cell":
    total = run.Cell()
    for cell in backend_run.cells.values():
        total.cases += cell.cases
        total.mismatches += cell.mismatches
        total.errors += cell.errors
    return total


def matrix_text(
    runs, not_run: dict, size: str, seconds: float, marks=MARKS, shown: int = 10
) -> str:
    """The report `lowp conformance` prints: backends, the matrix, the first failures."""
    plans = ", ".join(f"{r.name}: {r.plan}" for r in runs if r.plan != size)
    lines = [f"lowp conformance: {size} plan" + (f" ({plans})" if plans else "")]
    lines += [f"  {r.name:<20} {r.description}" for r in runs]
    lines += [f"  {name:<20} not run: {why}" for name, why in not_run.items()]
    header = ["scheme"] + [r.name for r in runs]
    rows = [[kind] + [_cell_text(r.cells[kind], marks) for r in runs] for kind in run.ROWS]
    rows.append(["all"] + [_cell_text(_total(r), marks) for r in runs])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.append("")
    for row in [header, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    lines += [
        "",
        (
            f"{marks['pass']} N: N cases, all byte-identical to the NumPy reference; "
            f"{marks['fail']} M/N: M of N cases differ."
        ),
        (
            "A case is one edge-case input of one configuration "
            "(scheme, shape, input dtype, rounding)."
        ),
    ]
    failures = [(r.name, f) for r in runs for f in r.failures]
    if failures:
        lines += ["", f"first failures ({min(shown, len(failures))} of those recorded):"]
        for name, f in failures[:shown]:
            detail = f.get("error") or "\n      ".join(f["problems"])
            lines.append(f"  {name} {f['configuration']} [{f['edge_case']}]:\n      {detail}")
    cases_run = sum(_total(r).cases for r in runs)
    verdict = "PASS" if all(r.passed for r in runs) else "FAIL"
    lines += ["", f"{verdict}: {cases_run} cases on {len(runs)} backend(s) in {seconds:.1f} s"]
    return "\n".join(lines)


def report_json(runs, not_run: dict, size: str, seconds: float) -> dict:
    """Everything `matrix_text` shows, for machines."""
    backends = {}
    for r in runs:
        total = _total(r)
        backends[r.name] = {
            "ran": True,
            "description": r.description,
            "plan": r.plan,
            "cases": total.cases,
            "mismatches": total.mismatches,
            "errors": total.errors,
            "passed": r.passed,
            "seconds": round(r.seconds, 1),
        }
    for name, why in not_run.items():
        backends[name] = {"ran": False, "reason": why}
    return {
        "size": size,
        "passed": all(r.passed for r in runs),
        "seconds": round(seconds, 1),
        "platform": {
            "python": platform.python_version(),
            "machine": platform.platform(),
            "numpy": np.__version__,
        },
        "backends": backends,
        "matrix": {kind: {r.name: vars(r.cells[kind]).copy() for r in runs} for kind in run.ROWS},
        "failures": [{"backend": r.name, **f} for r in runs for f in r.failures],
    }
