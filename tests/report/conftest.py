"""A fake workflow folder as the working directory (the report rule runs in the workflow root), the report built on it
from the files its rule declares, and every figure of a report test checked."""

import pytest
from figure_checks import checking
from report_fakes import fake_root, tiny_spec
from report_md import build

from specfit.planning.matrix import report_inputs


@pytest.fixture(autouse=True)
def figures(monkeypatch) -> dict[str, list[str]]:
    """Every figure a report test saves is checked as a reader would see it (`figure_checks.checking`); by file name,
    the texts each drew."""
    return checking(monkeypatch)


@pytest.fixture()
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture()
def built(tree):
    spec = tiny_spec()
    written = fake_root(tree, spec)
    out = tree / "reports" / "all"
    _md, tables = build(spec, report_inputs(spec), out)
    return spec, written, out, tables
