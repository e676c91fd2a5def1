"""Root conftest: a package module is collected for its doctests only where it imports.

`python -m pytest` collects doctests from every module of the packages (pyproject
testpaths). A module that needs a package this machine lacks (torch, jax, flax, triton,
...) cannot import, and collecting it would be an error, not a skip. So each module's
module-level imports are read from its source, followed through the repository's own
modules (and the `__init__.py` of every package above it), and a module that reaches an
absent top-level package is left out of collection. Nothing is listed by hand: a new
module that imports triton at the top is left out where triton is absent, by the same
rule. The test folders skip themselves (`pytest.importorskip` in their conftests).

It also caps `pytest -n auto` (the README's test command; pytest-xdist) at
`MAX_WORKERS` workers: each imports torch and JAX, about 1 GB, so a worker a core of a
large machine would exhaust its memory for little gain.
"""

import ast
import functools
import importlib.util
import os
import pathlib

import pytest

_ROOT = pathlib.Path(__file__).parent
MAX_WORKERS = 4


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest without xdist ignores it
def pytest_xdist_auto_num_workers(config) -> int | None:
    """Workers for `-n auto`: one a core this process may run on, at most MAX_WORKERS;
    PYTEST_XDIST_AUTO_NUM_WORKERS, where set, as xdist reads it (None: xdist's own)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core
    cores = len(affinity(0)) if affinity else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


@functools.cache
def _installed(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a finder that refuses the name, or a broken install
        return False
    return spec is not None and spec.origin is not None  # not a bare namespace folder


def _source_of(module: str) -> pathlib.Path | None:
    """The file of a module of this repository (`a.b` -> a/b.py or a/b/__init__.py)."""
    base = _ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: pathlib.Path) -> set[str]:
    """Dotted names imported by statements at module level (not inside functions)."""
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    )
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import mod`
    return names


_IN_PROGRESS = object()
_MISSING: dict[str, object] = {}


def _missing(module: str) -> str | None:
    """The first absent package that importing `module` (of this repository) needs."""
    if module not in _MISSING:
        _MISSING[module] = _IN_PROGRESS  # an import cycle adds nothing new
        _MISSING[module] = _first_missing(module)
    found = _MISSING[module]
    return None if found is _IN_PROGRESS else found


def _first_missing(module: str) -> str | None:
    path = _source_of(module)
    if path is None:
        return None
    parents = module.split(".")[:-1]
    needed = {".".join(parents[: i + 1]) for i in range(len(parents))}  # packages above it
    needed |= _top_level_imports(path)
    for name in sorted(needed - {module}):
        if _source_of(name) is not None:
            absent = _missing(name)
        elif _source_of(name.partition(".")[0]) is not None:
            absent = None  # `from pkg import name` where name is not a module: pkg counts
        else:
            absent = None if _installed(name.partition(".")[0]) else name.partition(".")[0]
        if absent is not None:
            return absent
    return None


def pytest_ignore_collect(collection_path: pathlib.Path, config):
    path = pathlib.Path(collection_path)
    if path.suffix != ".py" or _ROOT not in path.parents or path.parts[len(_ROOT.parts)] == "tests":
        return None
    if _missing(_module_name(path)) is not None:
        return True
    return None


@pytest.fixture
def scaled_small_shape_costs(monkeypatch):
    """The small-shape policy (`lowp._small_shapes`) with its costs scaled down so that
    CPU-sized calls fall on both sides. A high-precision call costs 6*M*K*N flops at
    3.648e-4 TFLOP/s; an fp8 call's casts 1.5e-4 ms an element of x, w and y (its GEMMs
    nothing), and an eager fp8 call at least 1 ms of host time. So a 64 -> 32 layer pays
    from 32 tokens on in eager calls (M*K*N = 2**16) and from 18 in traced ones; with at
    most 64 tokens a call, a 16 -> 32 layer never pays."""
    from lowp import _small_shapes

    scaled = _small_shapes.Costs(
        fp8_tflops=1e12,
        bf16_tflops=3.648e-4,
        cast_bytes=1.5,
        bandwidth_tb_s=1e-5,
        fp8_host_ms=1,
        bf16_host_ms=0,
        overlap=0,
    )
    monkeypatch.setattr(_small_shapes, "COSTS", {_small_shapes.DEFAULT_RECIPE: scaled})
    monkeypatch.setattr(_small_shapes, "MAX_TOKENS", 64)
