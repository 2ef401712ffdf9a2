"""The DAG itself: it lints, it is formatted, and it plans on a laptop and on a SLURM cluster."""

import subprocess
import sys


def run(root, *args):
    return subprocess.run([sys.executable, "-m", *args], check=False, cwd=root, capture_output=True, text=True,
                          timeout=300)


def test_dry_run_lists_every_stage(root):
    proc = run(root, "snakemake", "-n", "reports/all", "--forceall")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rule in ("toy_tokenizer", "toy_target", "toy_drafter", "extract", "calibrate", "atlas", "predictor", "decode",
                 "theory", "report"):
        assert f"rule {rule}:" in proc.stdout, rule


def test_cluster_profile_plans_gpu_jobs(root):
    proc = run(root, "snakemake", "-n", "--workflow-profile", "workflow/profiles/slurm", "reports/all", "--forceall")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rule decode:" in proc.stdout


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
