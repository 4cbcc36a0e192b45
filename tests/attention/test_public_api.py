"""`attention`'s public surface: `__all__` is what docs/attention.md documents, and `__version__` is the
distribution's."""

import re
from pathlib import Path

import attention

ROOT = Path(__file__).resolve().parents[2]


def documented_names() -> list[str]:
    """The first column of docs/attention.md's "Public API" table."""
    text = (ROOT / "docs/attention.md").read_text()
    section = text.split("## Public API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|", section, flags=re.M)


def test_the_documented_api_is_all():
    assert sorted(documented_names()) == sorted(attention.__all__)
    for name in attention.__all__:
        assert hasattr(attention, name), name


def test_the_version_is_setup_cfgs():
    assert re.fullmatch(r"\d+\.\d+\.\d+", attention.__version__)
    assert "version = attr: attention.__version__" in (ROOT / "setup.cfg").read_text()


def test_a_moved_module_still_resolves_its_names_with_a_deprecation_warning():
    import pytest

    import attention.formulation as moved
    from attention import head

    with pytest.warns(DeprecationWarning, match=r"attention\.formulation\.Formulation moved to attention\.head"):
        assert moved.Formulation is head.Formulation is attention.Formulation
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        moved.nothing

    import attention.grouped as grouped
    from attention import core, masks

    for name, home in (("Options", head), ("with_structure", masks), ("relayout", core), ("to_grouped", core)):
        with pytest.warns(DeprecationWarning, match=f"attention.grouped.{name} moved to {home.__name__}.{name}"):
            assert getattr(grouped, name) is getattr(home, name)
