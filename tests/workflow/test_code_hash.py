"""Code hashes: an edit to package code reruns the rules whose stage runs that code, and only those."""

import shutil

import pytest

import specfit.planning.code as wf
from specfit.planning.code import code_closure, code_hash

STAGES = ("specfit.stages.extract", "specfit.stages.calibrate", "specfit.stages.atlas", "specfit.stages.decode",
          "specfit.stages.tune", "specfit.stages.theory", "specfit.stages.report")


def test_calibration_does_not_run_the_decode_stream_or_its_metrics():
    closure = code_closure("specfit.stages.calibrate")
    decode = {"specfit.stages.decode", "specfit.stages.atlas", "specfit.results.metrics", "specfit.results.summary",
              "specfit.speculative.loading", "specfit.speculative.stream"}
    assert not decode & set(closure)
    assert "specfit.speculative.request" in closure  # the cycle API it shares with decode


def test_theory_reads_records_without_drafting_or_verification():
    closure = set(code_closure("specfit.stages.theory"))
    assert {"specfit.results.records", "specfit.speculative.routes", "specfit.selection.pool"} <= closure
    assert not {"specfit.speculative.draft", "specfit.speculative.verify", "specfit.speculative.request",
                "specfit.models", "specfit.engine", "specfit.stages.decode"} & closure


def test_no_stage_imports_another():
    for stage in STAGES:
        assert set(code_closure(stage)) & set(STAGES) == {stage}, stage


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A copy of the package that the code hashes read, to edit."""
    copy = tmp_path / "specfit"
    shutil.copytree(wf.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(wf, "PACKAGE_DIR", copy)
    return copy


def edit(path):
    path.write_text(path.read_text() + "\n# an edit\n")


def test_an_edit_to_decode_metrics_reruns_decode_and_atlas_not_calibration(package):
    before = {stage: code_hash(stage) for stage in STAGES}
    edit(package / "results" / "metrics.py")
    changed = {stage for stage in STAGES if code_hash(stage) != before[stage]}
    # the report reads metrics.json by its keys; the tune stage ranks its trees by them
    assert changed == {"specfit.stages.decode", "specfit.stages.atlas", "specfit.stages.tune", "specfit.stages.report"}


def test_an_edit_to_drafting_reruns_every_stage_that_drafts(package):
    before = {stage: code_hash(stage) for stage in STAGES}
    edit(package / "speculative" / "draft.py")
    changed = {stage for stage in STAGES if code_hash(stage) != before[stage]}
    assert changed == {"specfit.stages.calibrate", "specfit.stages.atlas", "specfit.stages.decode",
                       "specfit.stages.tune"}


def test_a_package_init_counts_and_type_only_imports_do_not(package):
    before = code_hash("specfit.stages.theory")
    edit(package / "speculative" / "__init__.py")  # runs before speculative.routes, which theory imports
    assert code_hash("specfit.stages.theory") != before
    # routes.py imports CandidatePool only for annotations, under TYPE_CHECKING
    source = (package / "speculative" / "routes.py").read_text()
    assert "if TYPE_CHECKING:\n    from specfit.selection.pool import CandidatePool" in source
    assert "specfit.selection.pool" not in wf._specfit_imports(package / "speculative" / "routes.py",
                                                              "specfit.speculative.routes")


def test_an_edit_to_the_papers_figures_reruns_only_the_report(package):
    before = {stage: code_hash(stage) for stage in STAGES}
    edit(package / "data" / "paper_results.yaml")
    assert {stage for stage in STAGES if code_hash(stage) != before[stage]} == {"specfit.stages.report"}
    edit(package / "data" / "paper_coefficients.yaml")  # the calibration presets
    assert code_hash("specfit.stages.calibrate") != before["specfit.stages.calibrate"]


TIMED = ("specfit.stages.decode", "specfit.stages.calibrate", "specfit.stages.atlas")  # the jobs that time decoding


@pytest.mark.parametrize("part", [
    ("planning", "config.py"),  # config validation and its messages
    ("planning", "matrix.py"),  # the run matrix
    ("planning", "paths.py"),  # file names: a job gets its paths from its rule
    ("planning", "stage.py"),  # the stage command line
    ("planning", "__init__.py"),
    ("report", "render.py"),  # the report
    ("report", "sections", "claims.py"),
    ("report", "templates", "report.md.j2"),
])
def test_an_edit_to_planning_or_the_report_reruns_no_timed_job(package, part):
    """What decides a job's files and spec (the planning package) and what shows its results (the report) leave
    every decode, calibration and atlas job's code hash unchanged: no edit there reruns a timing job."""
    before = {stage: code_hash(stage) for stage in TIMED}
    edit(package.joinpath(*part))
    assert {stage: code_hash(stage) for stage in TIMED} == before


def test_the_closures_of_timed_jobs_hold_no_planning_or_report_module():
    for stage in TIMED:
        closure = set(code_closure(stage))
        assert not {m for m in closure if m.startswith(("specfit.planning", "specfit.report"))}, stage
        assert "specfit.engine.offload" in closure, stage  # the closure is followed, not empty
