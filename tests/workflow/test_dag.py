"""The DAG itself: it lints, it is formatted, and it plans on a laptop and on a SLURM cluster."""

import re
import subprocess
import sys

import yaml


def run(root, *args):
    return subprocess.run([sys.executable, "-m", *args], check=False, cwd=root, capture_output=True, text=True,
                          timeout=300)


STAGES = ("extract", "calibrate", "atlas", "predictor", "decode", "theory", "report")
TOY_RULES = ("toy_tokenizer", "toy_target", "toy_drafter")


def jobs(stdout: str) -> list[tuple[str, str]]:
    """A dry run's jobs: each one's rule and its block of lines from ``rule <name>:`` on."""
    found = []
    for block in stdout.split("\n\n"):
        lines = block.splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith(("rule ", "localrule "))), None)
        if start is not None:
            found.append((lines[start].split()[1].rstrip(":"), "\n".join(lines[start:])))
    return found


def test_dry_run_lists_every_stage_and_trains_no_toy(root):
    """config.yaml reads the shipped toy: its DAG, even forced, holds every stage and no training of the toy."""
    proc = run(root, "snakemake", "-n", "reports/all", "--forceall")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = {rule for rule, _ in jobs(proc.stdout)}
    assert set(STAGES) <= rules and not rules & set(TOY_RULES), rules
    assert "data/models/toy/target" in proc.stdout  # an input, read as it is


def test_smoke_dry_run_trains_its_own_toy(root):
    """tests/smoke.yaml trains a toy under its own name: the toy rules stay in CI's DAG, for that model only."""
    proc = run(root, "snakemake", "-n", "reports/all", "--forceall", "--configfile", "tests/smoke.yaml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    toy_jobs = [(rule, block) for rule, block in jobs(proc.stdout) if rule in TOY_RULES]
    assert sorted(rule for rule, _ in toy_jobs) == sorted(TOY_RULES)
    assert all("wildcards: model=smoke" in block for _, block in toy_jobs)
    assert set(STAGES) <= {rule for rule, _ in jobs(proc.stdout)}


def test_training_jobs_hold_the_cores_they_train_with(root):
    """The toy's target and drafter and the route predictor train with `train_threads` torch threads whatever the
    job is given, so their jobs ask Snakemake for those cores: no other job runs on them (the predictor took 20 times
    as long beside a decode job under `--cores 2`)."""
    proc = run(root, "snakemake", "-n", "reports/all", "--forceall", "--cores", "4", "--configfile", "tests/smoke.yaml",
               "--config", "train_threads=3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    training = [block for rule, block in jobs(proc.stdout) if rule in ("toy_target", "toy_drafter", "predictor")]
    assert len(training) == 3 and all(re.search(r"^\s*threads: 3$", block, re.M) for block in training), training
    assert not re.search(r"^\s*threads: 3$", dict(jobs(proc.stdout))["decode"], re.M)


def test_cluster_profile_plans_gpu_jobs(root):
    proc = run(root, "snakemake", "-n", "--workflow-profile", "workflow/profiles/slurm", "reports/all", "--forceall")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rule decode:" in proc.stdout


def test_cluster_profile_sends_every_gpu_rule_to_the_gpu_partition(root):
    """A rule whose jobs may ask for a GPU (a `gpu=` resource) has its own GPU job in the SLURM profile: else a CUDA
    device's job would go to the CPU partition asking for a GPU."""
    asking = {name for text in (root / "rules").glob("*.smk") for name, body in
              re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", text.read_text(), re.M | re.S) if "gpu=" in body}
    profile = yaml.safe_load((root / "workflow/profiles/slurm/config.yaml").read_text())["set-resources"]
    on_gpu = {rule for rule, entry in profile.items() if str(entry).startswith("?gpu_job(")}
    assert asking == on_gpu and {"calibrate", "atlas", "predictor", "tune", "decode"} <= asking, (asking, on_gpu)


def test_lint_and_format(root):
    lint = run(root, "snakemake", "--lint")
    assert lint.returncode == 0, lint.stdout[-2000:] + lint.stderr[-2000:]
    fmt = subprocess.run(["snakefmt", "--check", "workflow/Snakefile", "rules/"], check=False, cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert fmt.returncode == 0, fmt.stderr[-2000:]


def test_python_is_ruff_clean(root):
    """ruff, configured in pyproject.toml, over the package and the tests (beside snakefmt over the rules)."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests"], check=False, cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
