"""The method kinds' registry: one declaration per kind, read by planning, the decode stage and the report."""

import subprocess
import sys

import pytest

from specfit.errors import SpecFitError
from specfit.planning.code import code_closure
from specfit.speculative.config import MethodConfig
from specfit.speculative.kinds import BUILTIN, COMPARED, RIVAL, Kind, kind, register_kind, routed, with_role
from specfit.speculative.methods import Method


@pytest.mark.parametrize("k", BUILTIN, ids=lambda k: k.name)
def test_each_builtin_kind_names_its_class(k):
    cls = k.implementation()
    assert issubclass(cls, Method)
    assert kind(k.name) is k


def test_the_lists_the_rest_reads_are_derived():
    assert set(routed()) >= {"specfit", "specfit-ca", "specfit-prefetch", "eagle3-prefetch"}
    assert "ar" not in routed() and "eagle3" not in routed()
    assert with_role(COMPARED) == ("ar", "eagle3", "specfit", "specfit-ca")
    assert with_role(RIVAL) == ("ar", "eagle3", "eagle3-prefetch")
    assert {k.name: k.theory_cost for k in BUILTIN if k.theory_cost} == {
        "specfit": "paper", "specfit-ca": "cache_aware", "specfit-prefetch": "cache_aware"}


def test_a_builtin_name_cannot_be_taken_and_an_unknown_kind_is_named():
    with pytest.raises(SpecFitError, match="built in"):
        register_kind(Kind("specfit", "mylab:Mine"))
    with pytest.raises(SpecFitError, match="unknown method kind 'nope'"):
        kind("nope")
    with pytest.raises(SpecFitError, match="cannot import 'no_such_module'"):
        kind("no_such_module:x")
    with pytest.raises(SpecFitError, match="theory cost"):
        Kind("x", "m:C", theory_cost="fast")


def test_a_users_kind_imports_from_the_workflow_root(tmp_path, monkeypatch):
    """A module beside config.yaml imports under a console script too (whose import path lacks the working
    directory), as docs/adding-a-method.md puts it; a module found nowhere names where it was looked for."""
    (tmp_path / "rootlab").mkdir()
    (tmp_path / "rootlab" / "chain.py").write_text(
        "from specfit.speculative.methods import Method, register_method\n\n"
        "@register_method('root-chain')\nclass RootChain(Method):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert kind("rootlab.chain:root-chain").name == "root-chain"
    with pytest.raises(SpecFitError, match=rf"cannot import 'rootlab.nope' .* from {tmp_path} or the installed"):
        kind("rootlab.nope:x")


def test_drafting_is_the_kinds_declaration():
    ar, eagle = (kind(n).implementation()(MethodConfig(n)) for n in ("ar", "eagle3"))
    assert (ar.drafts, ar.max_depth, eagle.drafts) == (False, 0, True)


def test_the_registry_is_import_light_and_the_decode_hash_follows_its_classes():
    code = "import sys, specfit.speculative.kinds; print(sorted({'numpy', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
    assert "specfit.speculative.prefetching" in code_closure("specfit.stages.decode")
