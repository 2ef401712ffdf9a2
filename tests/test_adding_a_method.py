"""docs/adding-a-method.md, run as a user runs it: the page's files at the root of a copy of the workflow, then the
page's commands as they stand (the experiment too: the device's calibration, four decode runs and the report), and
what the page says they show: the chain's jobs in the plan, AR's output from `specfit generate`, and the chain
beside AR in the report, identical to AR on every request."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from doc_commands import markdown_blocks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "adding-a-method.md"


def test_the_recipe_as_a_user_runs_it(workflow_copy, tmp_path):
    (block,), files = markdown_blocks(PAGE, ROOT)
    assert set(files) == {"mylab/chain.py", "chain.yaml"} and block.parse_only is None
    workdir = workflow_copy(tmp_path)
    for name, text in files.items():
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # nothing the page does not say
    done = []
    for command in block.commands:
        proc = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=1800)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        done.append(proc)
    plan, generate, _ = done
    assert plan.stdout.count("method=chain") == 2  # its decode jobs, without a cache and with 12 slots
    assert generate.stderr.splitlines()[-1].startswith("ar: identical output")
    for slots in (0, 12):
        metrics = json.loads((workdir / f"data/decode/toy/cpu-a100/gsm8k/chain/slots{slots}/metrics.json").read_text())
        assert metrics["n_requests"] == metrics["lossless"]["n_identical"] == 80  # the paper's 80 GSM8K questions
    tables = json.loads((workdir / "reports/all/tables.json").read_text())["tables"]
    (lossless,) = [t for t in tables if t["id"] == "lossless/toy/cpu-a100"]
    identical = lossless["header"].index("Identical to the reference")
    assert {row["key"]: row["cells"][identical] for row in lossless["rows"] if "/chain/" in row["key"]} == {
        f"toy/cpu-a100/gsm8k/chain/{slots}": "identical: 80 of 80 requests" for slots in (0, 12)}
