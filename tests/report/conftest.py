"""A fake workflow folder as the working directory (the report rule runs in the workflow root), and the report
built on it from the files its rule declares."""

import pytest
from report_fakes import fake_root, tiny_spec
from report_md import build

from specfit.planning.matrix import report_inputs


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
