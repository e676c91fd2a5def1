"""The suite collects without each optional package: its tests skip, nothing errors.

Each case runs `pytest --collect-only` in a fresh interpreter whose site-packages is a
copy (of links) of this one's without the named packages, as on a machine where they
were never installed.
"""

import importlib.util
import os
import pathlib
import re
import site
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Run with `python -S`: no site-packages but the one given, whose .pth files (the
# editable install of lowp among them) addsitedir processes. A collection runs no test,
# so it skips what only running tests needs, a third of its CPU time: rewriting every
# module's asserts (--assert=plain) and the unraisable-exception plugin's five garbage
# collections at exit (over a heap holding torch and jax).
_COLLECT = (
    "import site, sys; site.addsitedir(sys.argv[1]); import pytest; "
    "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', "
    "'--assert=plain', '-p', 'no:unraisableexception']))"
)

# The last line of a collection: "N tests collected in ...", or with the slow tier left
# out (pyproject's addopts) "K/N tests collected (M deselected) in ...".
_SUMMARY = r"(\d+/)?\d+ tests collected( \(\d+ deselected\))? in .*"


def _site_without(packages: list[str], into: pathlib.Path) -> pathlib.Path:
    into.mkdir()
    for site_dir in map(pathlib.Path, site.getsitepackages()):
        for entry in site_dir.iterdir():
            stem = entry.name.split("-")[0].removesuffix(".py")
            if stem in packages or (into / entry.name).exists():
                continue
            (into / entry.name).symlink_to(entry)
    return into


@pytest.mark.slow
@pytest.mark.parametrize(
    "absent",
    [
        "triton",
        "torchao",
        "flax",
        "jax,jaxlib,flax",
        "torch",
        "torch,torchao,triton,jax,jaxlib,flax",
        "compressed_tensors,modelopt,transformers,safetensors",
        "xdist,pytest_xdist",  # the root conftest's `-n auto` hook is optional
    ],
)
def test_suite_collects_without(absent, tmp_path):
    packages = absent.split(",")
    site_dir = _site_without(packages, tmp_path / "site-packages")
    done = subprocess.run(
        [sys.executable, "-S", "-c", _COLLECT, str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # a failure is reported below, with the output
    )
    out = done.stdout + done.stderr
    # The last line pytest prints on stdout; stderr may end with a plugin's warning
    # (pytest-benchmark warns under xdist, whose worker variable the child inherits).
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and re.fullmatch(_SUMMARY, summary), (
        f"collection without {absent} failed:\n{out[-4000:]}"
    )
    probe = (
        "import site, sys; site.addsitedir(sys.argv[1]); "
        f"import importlib.util as u; sys.exit(any(u.find_spec(p) for p in {packages!r}))"
    )
    check = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(site_dir)], capture_output=True, check=False
    )
    assert check.returncode == 0, f"{absent} still importable: the case tests nothing"


def test_auto_workers_are_one_a_core_up_to_the_cap(monkeypatch):
    """`pytest -n auto` (the README's test command) takes a worker a core, at most the
    root conftest's MAX_WORKERS, and leaves PYTEST_XDIST_AUTO_NUM_WORKERS to xdist."""
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    for cores, workers in [(1, 1), (2, 2), (64, root.MAX_WORKERS)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)))
        assert root.pytest_xdist_auto_num_workers(None) == workers
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1")
    assert root.pytest_xdist_auto_num_workers(None) is None
