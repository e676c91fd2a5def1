"""`lowp conformance`: the matrix, --json, the exit status, and bad options.

The plan is cut to a few configurations here (the plumbing is what is tested; the
cases themselves run in test_cross_backend.py)."""

import json

import pytest

from lowp_apps import cli
from lowp_apps.conformance import backends, cases, grouped

TINY = [c for c in cases.configurations("thin") if c.kind in ("mx", "nvfp4")][:3]


@pytest.fixture(autouse=True)
def tiny_plan(monkeypatch):
    monkeypatch.setattr(cases, "configurations", lambda size: list(TINY))
    monkeypatch.setattr(grouped, "cases", lambda size: [])  # test_grouped_operands.py runs them


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `lowp conformance ARGV...`."""
    code = cli.main(["conformance", "--no-progress", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_matrix_of_every_present_backend(capsys):
    code, out, err = run(capsys)
    present = [b.name for b in backends.present()]
    n = sum(len(cases.inputs(c)) for c in TINY)
    assert code == 0, out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["scheme"] == present
    assert rows["tensor"] == ["✓", "0"] * len(present)  # no tensor-scaled case in this plan
    assert rows["all"] == ["✓", str(n)] * len(present)
    assert all(name in rows for name in backends.NAMES)  # run, or not run with the reason
    assert (
        out.rstrip()
        .splitlines()[-1]
        .startswith(f"PASS: {n * len(present)} cases on {len(present)} backend(s)")
    )
    assert all(f"{name}: {n} cases, 0 failing" in err for name in present)


def test_json_counts_and_reasons(capsys):
    code, out, _ = run(capsys, "--json", "--backend", "numpy,torch_cpu")
    report = json.loads(out)
    assert code == 0 and report["passed"] is True and report["size"] == "quick"
    n = sum(len(cases.inputs(c)) for c in TINY)
    assert (
        report["backends"]["numpy"]["cases"] == n
        and report["backends"]["torch_cpu"]["mismatches"] == 0
    )
    assert report["backends"]["jax_cpu"] == {"ran": False, "reason": "not asked for (--backend)"}
    assert report["backends"]["jax_gpu"]["ran"] is False and report["backends"]["jax_gpu"]["reason"]
    assert sum(report["matrix"][k]["torch_cpu"]["cases"] for k in cases.KINDS) == n
    assert report["failures"] == []


def test_a_mismatch_shows_and_exits_1(capsys, monkeypatch):
    from lowp_torch import _bits as torch_bits

    monkeypatch.setattr(torch_bits, "ftz", lambda x: x)  # a dropped flush in lowp_torch
    code, out, _ = run(capsys, "--backend", "torch_cpu")
    assert code == 1
    assert (
        "✗" in out and "first failures" in out and out.rstrip().splitlines()[-1].startswith("FAIL:")
    )
    assert "[only_subnormals]" in out and "first at index" in out and "input[" in out
    code, out, _ = run(capsys, "--backend", "torch_cpu", "--json")
    report = json.loads(out)
    assert (
        code == 1 and report["passed"] is False and report["failures"][0]["backend"] == "torch_cpu"
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "tpu"], "unknown conformance backend 'tpu'"),
        (["--backend", ","], "--backend needs a name"),
        (["--size", "huge"], "--size must be quick or full, got 'huge'"),
    ],
)
def test_bad_options_name_the_value(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_an_absent_backend_says_why(capsys):
    absent = [b for b in backends.BACKENDS if b.problem() is not None]
    if not absent:
        pytest.skip("every backend is present on this machine")
    code, _, err = run(capsys, "--backend", absent[0].name)
    assert code == 2 and f"backend {absent[0].name!r} cannot run here: {absent[0].problem()}" in err
