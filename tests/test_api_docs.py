"""The API reference in docs/api is what docs/api/generate.py writes from the docstrings.

A docstring, signature or `__all__` changed without regenerating the pages fails here,
naming the command that brings them up to date.
"""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"


def _generator():
    spec = importlib.util.spec_from_file_location("lowp_api_docs", API / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _generator()


@pytest.mark.parametrize("page", generate.all_pages())
def test_page_is_what_the_docstrings_say(page):
    for name in generate.REQUIRES.get(page, ()):
        pytest.importorskip(name)
    committed = (API / page).read_text(encoding="utf-8") if (API / page).exists() else None
    assert committed == generate.render(page), (
        f"docs/api/{page} is stale: it differs from what the docstrings give. "
        f"Regenerate the API reference: python docs/api/generate.py"
    )
    # nothing of the machine it was generated on: a clone elsewhere must match it
    assert str(API.parent.parent) not in committed


def test_every_page_is_generated():
    """No page in docs/api that the generator does not write (a renamed module's old page)."""
    written = set(generate.all_pages())
    on_disk = {path.name for path in API.glob("*.md")}
    assert on_disk == written, f"docs/api holds {sorted(on_disk - written)} beyond the generator's"


@pytest.mark.parametrize("page", generate.all_pages())
def test_every_public_name_has_a_docstring(page):
    for name in generate.REQUIRES.get(page, ()):
        pytest.importorskip(name)
    heading, missing = None, []
    for line in generate.render(page).splitlines():
        if line.startswith("#"):
            heading = line
        elif line == "*(no docstring)*":
            missing.append(heading)
    assert not missing, f"docs/api/{page}: no docstring under {missing}"


def test_a_page_shows_signatures_and_docstrings():
    import inspect

    import lowp

    text = generate.render("lowp.md")
    assert "## `lowp.quantize`" in text
    assert "lowp.quantize(x: ndarray, scheme: Scheme, *, rounding: str = 'nearest'" in text
    first_paragraph = inspect.getdoc(lowp.quantize).split("\n\n")[0]
    assert f"```\n\n{first_paragraph}\n" in text  # right under the signature
