"""Every command the docs show a user is run here, in a form that fits the suite's budget.

The commands are the fenced shell blocks of README.md and docs/*.md and the indented commands opening the config
overlays and profiles (tests/doc_commands.py reads them). In a copy of the workflow (the shipped toy, Spec-Bench's
questions, the overlays, tests/smoke.yaml, scripts/) with the page's own files written where it names them, each
block runs as a user runs it, but every ``snakemake`` that would run jobs is a dry run (``-n``). A block marked
``doc-test: parse-only: why`` in the doc's source (a GPU, a cluster, minutes of training or timing) is only parsed:
its programs exist and their flags parse (tests/parse_only.py). A command that fails either way fails here."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from doc_commands import (
    HEADER_COMMAND,
    PROGRAMS,
    dry,
    header_blocks,
    indented_commands,
    markdown_blocks,
    simple_commands,
)

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
HEADERS = [*sorted(ROOT.glob("config*.yaml")), ROOT / "tests" / "smoke.yaml",
           *sorted(ROOT.glob("workflow/profiles/*/config.yaml"))]
BUILTINS = (".", "source", "export", "echo", "eval", "cd")
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # this venv's tools


def _blocks():
    found = []
    for page in PAGES:
        blocks, files = markdown_blocks(page, ROOT)
        found += [(block, files) for block in blocks]
    return found + [(block, {}) for path in HEADERS for block in header_blocks(path, ROOT)]


BLOCKS = _blocks()


@pytest.fixture(scope="module")
def workdir(workflow_copy, tmp_path_factory) -> Path:
    """A workflow root as a user has it after README command 1's install: the overlays, tests/smoke.yaml and
    scripts/ beside the workflow."""
    workdir = workflow_copy(tmp_path_factory.mktemp("docs"))
    shutil.copytree(ROOT / "scripts", workdir / "scripts")
    for overlay in ROOT.glob("config.*.yaml"):
        shutil.copy(overlay, workdir / overlay.name)
    (workdir / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "smoke.yaml", workdir / "tests" / "smoke.yaml")
    return workdir


def test_the_docs_show_commands_where_the_test_reads_them():
    """Commands in an indented code block, or a YAML header's command indented otherwise, would escape the test."""
    assert len(BLOCKS) >= 20, [b.id for b, _ in BLOCKS]
    hidden = {page.name: found for page in PAGES if (found := indented_commands(page))}
    assert not hidden, f"commands in indented blocks (fence them as ```bash): {hidden}"
    for path in HEADERS:
        lines = path.read_text().split("\n\n", 1)[0].splitlines()
        stray = [line for line in lines if re.match(rf"^#\s+({'|'.join(PROGRAMS)}) ", line)
                 and not HEADER_COMMAND.match(line)]
        assert not stray, f"{path.name}: commands not indented by five spaces after '#': {stray}"


def parse_problems(block, workdir: Path) -> list[str]:
    """What does not parse among the block's commands: Python programs through tests/parse_only.py, scripts by
    ``bash -n`` and a ``case`` arm naming their subcommand, other programs by being installed (or named in the
    marker as what the test machine may lack)."""
    python, problems = [], []
    words = [w for command in block.commands for w in simple_commands(command)]
    while words:
        program, *args = words.pop(0)
        if program == "eval":
            words += [w for arg in args if (inner := re.fullmatch(r"\$\((.*)\)", arg)) for w in
                      simple_commands(inner.group(1))]
        elif program in BUILTINS:
            continue
        elif program in PROGRAMS:
            python.append([program, *args])
        elif "/" in program:
            script = workdir / program
            if not (script.is_file() and os.access(script, os.X_OK)):
                problems.append(f"{program}: no executable script")
            elif subprocess.run(["bash", "-n", script]).returncode != 0:
                problems.append(f"{program}: bash -n fails")
            elif args and not re.search(rf"^\s*(\S+\|)*{re.escape(args[0])}(\|\S+)*\)", script.read_text(), re.M):
                problems.append(f"{program}: no subcommand {args[0]!r}")
        elif shutil.which(program) is None and f"`{program}`" not in block.parse_only:
            problems.append(f"{program}: not installed, and the marker does not say the test machine may lack it")
    if python:
        proc = subprocess.run([sys.executable, str(ROOT / "tests" / "parse_only.py"), json.dumps(python)],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)  # pytest: the checkout
        problems += [line for line in proc.stdout.splitlines() if re.match(r"parse_only [^0]", line)]
        if proc.returncode != 0:
            problems.append(proc.stderr[-2000:])
    return problems


@pytest.mark.parametrize("block, files", BLOCKS, ids=[block.id for block, _ in BLOCKS])
def test_doc_command(block, files, workdir):
    assert block.commands, f"{block.id}: an empty block"
    problems = parse_problems(block, workdir)
    assert not problems, f"{block.id}: " + "\n".join(problems)
    if block.parse_only:
        return
    for name, text in files.items():  # the page's own files, where it puts them
        (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / name).write_text(text)
    script = "set -euxo pipefail\n" + "\n".join(dry(command) for command in block.commands)
    proc = subprocess.run(["bash", "-c", script], cwd=workdir, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{block.id}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
