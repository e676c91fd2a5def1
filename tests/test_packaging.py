"""The package metadata that users and type checkers read: version and py.typed."""

import pathlib
import tomllib

import lowp

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("lowp", "lowp_torch", "lowp_jax", "lowp_apps")


def _pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_version_is_pyprojects():
    version = _pyproject()["project"]["version"]
    assert lowp.__version__ == version
    assert lowp._source_version() == version  # the fallback of an uninstalled tree


def test_every_package_ships_py_typed():
    for package in PACKAGES:
        assert (ROOT / package / "py.typed").is_file(), package
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["*"]
