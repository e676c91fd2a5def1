"""The layers of the house (docs/architecture.md), checked on the sources' imports.

core (lowp) <- frontends (lowp_torch, lowp_jax) <- applications (lowp_apps) <- bench.
A frontend or application uses the core through `lowp` and `lowp.extend` only; the core
imports numpy, ml_dtypes and the standard library; no package imports a layer above it;
the two frontends never import each other.
"""

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("lowp", "lowp_torch", "lowp_jax", "lowp_apps")
# What each package may import of the repository's packages.
ALLOWED = {
    "lowp": {"lowp"},
    "lowp_torch": {"lowp", "lowp_torch"},
    "lowp_jax": {"lowp", "lowp_jax"},
    "lowp_apps": {"lowp", "lowp_torch", "lowp_jax", "lowp_apps"},
}
CORE_THIRD_PARTY = {"numpy", "ml_dtypes"}
# Public core modules a frontend or application may import by name.
CORE_PUBLIC_MODULES = {"lowp", "lowp.extend"}


def _imports(path: pathlib.Path):
    """(line, imported dotted name) of every import in a file, at any depth; for
    `from a import b` both `a` and `a.b` (b may be a module)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _private_core_attributes(path: pathlib.Path):
    """(line, text) of `lowp._name` attribute uses (a private module reached by attribute)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "lowp"
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            yield node.lineno, f"lowp.{node.attr}"


def _sources(package: str):
    # lowp/__main__.py only launches lowp_apps with runpy (`python -m lowp`); no import.
    return sorted((ROOT / package).rglob("*.py"))


def test_no_package_imports_a_layer_above_it():
    wrong = []
    for package in PACKAGES:
        for path in _sources(package):
            for line, name in _imports(path):
                top = name.partition(".")[0]
                if top in PACKAGES and top not in ALLOWED[package]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_core_imports_numpy_ml_dtypes_and_the_standard_library_only():
    wrong = []
    for path in _sources("lowp"):
        for line, name in _imports(path):
            top = name.partition(".")[0]
            if top not in CORE_THIRD_PARTY | {"lowp"} and top not in sys.stdlib_module_names:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", ["lowp_torch", "lowp_jax", "lowp_apps"])
def test_frontends_and_applications_use_the_core_through_lowp_and_lowp_extend(package):
    wrong = []
    for path in _sources(package):
        for line, name in _imports(path):
            core_module = name.partition(".")[0] == "lowp"
            if (
                core_module
                and name not in CORE_PUBLIC_MODULES
                and name.split(".")[1].startswith("_")
            ):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        wrong += [
            f"{path.relative_to(ROOT)}:{line} uses {text}"
            for line, text in _private_core_attributes(path)
        ]
    assert not wrong, "private core names outside the core:\n" + "\n".join(wrong)
