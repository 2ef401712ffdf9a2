"""The page on disk: relative links, provenance, and the stage's command line as the rule calls it."""

import json
import re
import subprocess
import sys

from report_fakes import fake_root, tiny_spec
from report_md import RATIO_CELL

from specfit.planning.matrix import DecodeRun, report_inputs
from specfit.report.page import EMULATED
from specfit.report.render import config_hash, git_commit, provenance, shipped_by


def test_html_links_are_relative_and_exist(built):
    spec, written, out, _tables = built
    html = (out / "index.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) >= 2  # throughput bars and the calibration scatter
    for src in sources:
        assert not src.startswith(("/", "file:", "http")), src
        assert (out / src).is_file()
    assert EMULATED in html
    assert "toy subset: first 2 GSM8K questions" in html
    assert config_hash(spec) in html
    for part in ("target", "drafter"):  # the toy's weights as their training records them, and what computed them
        assert f"sha256 {written[part]['sha256']}; trained on a test CPU (torch_cpu_capability AVX2, " \
               "MKL_CBWR COMPATIBLE,STRICT)" in html
    md = (out / "report.md").read_text()
    for link in re.findall(r"!\[[^]]*\]\(([^)]+)\)", md):
        assert (out / link).is_file()


def test_the_command_line_runs_without_pandas(tree):
    """``python -m specfit.stages.report`` with the rule's repeated --in flags, pandas hidden."""
    spec = tiny_spec()
    fake_root(tree, spec)
    flags = [f"--in={name}={path}" for name, files in report_inputs(spec).items() for path in files]
    code = ("import importlib.abc, runpy, sys\n"
            "class NoPandas(importlib.abc.MetaPathFinder):  # as if pandas were not installed\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.partition('.')[0] == 'pandas':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, NoPandas())\n"
            "sys.argv = ['specfit.stages.report', *sys.argv[1:]]\n"
            "runpy.run_module('specfit.stages.report', run_name='__main__', alter_sys=True)\n")
    out = tree / "report"
    proc = subprocess.run([sys.executable, "-c", code, "--spec", json.dumps(spec), *flags, "--out", f"report={out}"],
                          capture_output=True, text=True, cwd=tree, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "declared inputs are not read" not in proc.stderr
    assert (out / "report.md").is_file() and (out / "figures").is_dir()
    assert not list(out.parent.glob(".tmp-*"))  # written atomically
    md = (out / "report.md").read_text()
    assert "calibration.png" in md  # the calibration section read its points parquet without pandas
    assert "Missing inputs" not in md


def test_provenance_marks_a_dirty_tree(tmp_path, monkeypatch):
    assert git_commit(tmp_path) == "unknown"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = git_commit(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    (tmp_path / "a.txt").write_text("b")
    assert git_commit(tmp_path) == f"{head} (dirty tree)"
    monkeypatch.chdir(tmp_path)  # the provenance's commit: the working directory's, the workflow root
    assert git_commit() == f"{head} (dirty tree)"


def test_tables_json_holds_every_table_by_id_and_row_key(built):
    """tables.json gives back every table of the page: its id, header, each row's key (a run as its fields) and cells
    as the Markdown prints them."""
    _spec, written, out, tables = built
    data = {t["id"]: t for t in json.loads((out / "tables.json").read_text())["tables"]}
    assert list(data) == list(tables)
    for tid, t in tables.items():
        assert data[tid]["header"] == t.header and data[tid]["caption"] == t.caption
        assert [r["cells"] for r in data[tid]["rows"]] == t.rows
        keys = [r["key"] for r in data[tid]["rows"]]
        assert len(set(keys)) == len(keys), tid
        if not t.keys:
            assert keys == [f"#{n}" for n in range(len(t.rows))]
    run = next(k for k in written if isinstance(k, DecodeRun))
    counters = data[f"counters/toy/{run.device}/{run.workload}"]
    key = f"{run.model}/{run.device}/{run.workload}/{run.method}/{run.slots}"
    assert key in [r["key"] for r in counters["rows"]]
    md = (out / "report.md").read_text()
    ratio_cells = [c for t in data.values() for r in t["rows"] for c in r["cells"] if RATIO_CELL.search(c)]
    assert ratio_cells and sum(len(RATIO_CELL.findall(c)) for c in ratio_cells) == len(RATIO_CELL.findall(md))


def test_the_shipped_toy_says_what_trained_each_part():
    """The provenance row of the shipped toy: parts trained alike named together, one row per shipped model."""
    amd, intel = {"model_name": "AMD EPYC", "flags": ["avx2"]}, {"model_name": "Intel Xeon", "flags": ["avx2", "fma"]}
    manifest = {"commit": {"drafter": "d4af7e", "target": "0ld", "tokenizer": "0ld"},
                "cpu": {"drafter": intel, "target": amd, "tokenizer": amd}, "files": {}}
    assert shipped_by(manifest) == ("drafter trained at commit d4af7e on Intel Xeon (avx2, fma); target and tokenizer "
                                    "trained at commit 0ld on AMD EPYC (avx2)")
    manifest |= {"commit": dict.fromkeys(("drafter", "target", "tokenizer"), "0ld"),
                 "cpu": dict.fromkeys(("drafter", "target", "tokenizer"), amd)}
    assert shipped_by(manifest) == "trained at commit 0ld on AMD EPYC (avx2)"
    spec = {"devices": {}, "workloads": {}}
    assert ("Shipped toy (models.toy)", "trained at commit 0ld on AMD EPYC (avx2)") in provenance(spec, {},
                                                                                                  {"toy": manifest})
