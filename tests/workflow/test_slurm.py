"""The cluster profile on a real SLURM: what a cluster user meets (docs/cluster.md).

Skips unless a SLURM answers (`scontrol ping`; with SPECFIT_SLURM_REQUIRED set, fails instead): bring one up with
`eval "$(scripts/slurm-local.sh up)"` first. The smoke DAG runs through workflow/profiles/slurm with the local user
profile (workflow/profiles/slurm-local) in a copy of the workflow; with SPECFIT_LOCAL_SMOKE naming a finished local
smoke run (made as .ci/run makes its own), its outputs are compared with that run's.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from specfit.planning.config import load_config

pytestmark = pytest.mark.slow

SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")
PROFILES = ("--workflow-profile", "workflow/profiles/slurm", "--profile", "workflow/profiles/slurm-local")


def slurm_is_up() -> bool:
    try:
        return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


if not slurm_is_up():
    if os.environ.get("SPECFIT_SLURM_REQUIRED"):  # for CI: a SLURM that did not come up fails, not skips
        pytest.fail("SPECFIT_SLURM_REQUIRED is set, but no SLURM answers `scontrol ping`", pytrace=False)
    pytest.skip("no SLURM answers `scontrol ping` (scripts/slurm-local.sh up)", allow_module_level=True)


def snakemake(workdir: Path, *args: str, env: dict | None = None, timeout: int = 2700) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args, "--configfile", "smoke.yaml"], cwd=workdir,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def submissions(output: str) -> dict[str, str]:
    """SLURM job id -> its log, for every job this run submitted with sbatch."""
    return dict(SUBMITTED.findall(output))


def jobs_of_run(output: str) -> dict[str, dict]:
    """This run's SLURM jobs as squeue lists them (finished ones stay listed for the node's MinJobAge)."""
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    listing = subprocess.run(["squeue", "--states=all", "--noheader", "--name", run_id,
                              "--format=%i|%k|%P|%C|%m|%l|%T"], capture_output=True, text=True, check=True).stdout
    fields = ("comment", "partition", "cpus", "mem", "time_limit", "state")
    return {row[0]: dict(zip(fields, row[1:])) for line in listing.splitlines() if (row := line.split("|"))}


@pytest.fixture(scope="module")
def smoke(workflow_copy, tmp_path_factory):
    """The smoke DAG through the cluster profile, and the run's output (SPECFIT_SLURM_SMOKE: in that folder, a
    copy made before, finishing what it lacks)."""
    reuse = os.environ.get("SPECFIT_SLURM_SMOKE")
    workdir = Path(reuse) if reuse else workflow_copy(tmp_path_factory.mktemp("slurm_smoke"))
    proc = snakemake(workdir, *PROFILES, "reports/all")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    return workdir, output


def test_every_job_is_a_slurm_job(smoke):
    workdir, output = smoke
    planned = int(re.search(r"^total\s+(\d+)$", output, re.M).group(1))
    jobs = jobs_of_run(output)
    assert "localrule" not in output
    assert len(submissions(output)) == planned == len(jobs)
    assert {job["state"] for job in jobs.values()} == {"COMPLETED"}
    assert (workdir / "reports/all/index.html").stat().st_size > 0


def test_per_rule_resources_reach_the_job(smoke):
    """The profile's partition and time limit per rule, and its CPU and memory request capped by the node's size
    (SPECFIT_SLURM_MAX_CPUS/_MAX_MEM_MB from scripts/slurm-local.sh), as SLURM granted them."""
    _, output = smoke
    by_rule = {}
    for job in jobs_of_run(output).values():
        rule = re.match(r"rule_(\w+?)_wildcards|rule_(\w+)$", job["comment"])
        by_rule.setdefault(rule.group(1) or rule.group(2), set()).add(
            (job["partition"], job["cpus"], job["mem"], job["time_limit"]))
    max_cpus = int(os.environ.get("SPECFIT_SLURM_MAX_CPUS") or 1 << 20)
    max_mem_mb = int(os.environ.get("SPECFIT_SLURM_MAX_MEM_MB") or 1 << 40)

    def granted(partition, cpus, mem_mb, time_limit):
        return {(partition, str(min(cpus, max_cpus)), f"{min(mem_mb, max_mem_mb)}M", time_limit)}

    assert by_rule["decode"] == granted("gpu", 8, 96000, "12:00:00")
    assert by_rule["calibrate"] == granted("gpu", 8, 96000, "2:00:00")
    assert by_rule["predictor"] == granted("gpu", 8, 96000, "4:00:00")
    assert by_rule["toy_target"] == granted("cpu", 4, 16000, "30:00")
    assert by_rule["theory"] == granted("cpu", 4, 16000, "1:00:00")


def parquet_outputs(workdir: Path) -> dict[str, Path]:
    return {str(p.relative_to(workdir)): p for p in sorted((workdir / "data").rglob("*.parquet"))}


def rows(path: Path, columns=None) -> list[dict]:
    """A Parquet file's rows without its timings (t_* columns)."""
    table = pq.read_table(path)
    return table.select([c for c in columns or table.column_names if not c.startswith("t_")]).to_pylist()


def reads_fitted_coefficients(name: str, methods: dict) -> bool:
    """Outputs whose choices follow the calibration's fit, itself a fit to timings: the calibration itself, every
    atlas (a SpecFit variant's trajectory) and the decode runs of a method whose selection rule reads the cost."""
    parts = Path(name).parts
    return parts[1] in ("calibration", "atlas") or (parts[1] == "decode"
                                                    and methods[parts[5]]["kind"] not in ("ar", "eagle3"))


def test_outputs_equal_the_local_run(smoke):
    """The SLURM run's outputs equal the local run's apart from timings: the toy models byte for byte, the prompts,
    and every output of the stages whose choices do not follow measured times (AR and EAGLE-3 decodes) in all their
    columns but the t_* timings; every decode's generated tokens, SpecFit's included (greedy decoding is lossless,
    whatever tree the fitted cost picks)."""
    local = os.environ.get("SPECFIT_LOCAL_SMOKE")
    if not local:
        pytest.skip("SPECFIT_LOCAL_SMOKE names no local smoke run to compare with")
    workdir, _ = smoke
    methods = load_config(workdir / "config.yaml", workdir / "workflow/schemas/config.schema.yaml",
                          workdir / "smoke.yaml")["methods"]
    ours, theirs = parquet_outputs(workdir), parquet_outputs(Path(local))
    assert ours.keys() == theirs.keys()
    exact = [name for name in ours if not reads_fitted_coefficients(name, methods)]
    assert any("/ar/" in name for name in exact) and any("/eagle3/" in name for name in exact)
    assert [name for name in exact if rows(ours[name]) != rows(theirs[name])] == []
    requests = [name for name in ours if name.startswith("data/decode/") and name.endswith("requests.parquet")]
    tokens = ["request_id", "question_id", "output_ids", "n_output"]
    assert [name for name in requests if rows(ours[name], tokens) != rows(theirs[name], tokens)] == []
    weights = sorted(p.relative_to(workdir) for p in (workdir / "data/models").rglob("*.safetensors"))
    assert weights
    assert [w for w in weights if (workdir / w).read_bytes() != (Path(local) / w).read_bytes()] == []


def newest_mtime(paths) -> float:
    return max(p.stat().st_mtime for p in paths)


def wait_until_running(job_id: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "--states=all", "--noheader", "--jobs", job_id, "--format=%T"],
                               capture_output=True, text=True).stdout.strip()
        if state != "PENDING":
            return
        time.sleep(0.2)


def test_failed_job_names_its_slurm_log_and_a_rerun_resumes(smoke):
    """A job killed on the node (scancel: what a preemption, a time limit or an admin does) is reported with its
    SLURM log; the rerun submits only what did not finish, and leaves every finished output as it was."""
    workdir, _ = smoke
    shutil.rmtree(workdir / "data/theory", ignore_errors=True)
    shutil.rmtree(workdir / "reports/all", ignore_errors=True)
    decoded = list((workdir / "data/decode").rglob("*.parquet"))
    before = newest_mtime(decoded)

    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *PROFILES, "reports/all", "--configfile", "smoke.yaml"],
                            cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, cancelled = [], None
    for line in proc.stdout:
        lines.append(line)
        if cancelled is None and (m := SUBMITTED.search(line)) and "rule_theory/" in m.group(2):
            cancelled = m.groups()
            wait_until_running(cancelled[0])  # a job cancelled before it starts has no log yet
            subprocess.run(["scancel", cancelled[0]], check=True)
    output = "".join(lines)
    assert proc.wait(timeout=600) != 0, output[-3000:]
    assert cancelled, output[-3000:]
    job_id, log = cancelled
    assert f"SLURM-job '{job_id}' failed, SLURM status is: 'CANCELLED'" in output, output[-3000:]
    assert log in output.split(f"SLURM-job '{job_id}' failed")[1], output[-3000:]  # in the error report
    assert Path(log).is_file()  # kept: the plugin deletes only successful jobs' logs
    finished = [p for p in (workdir / "data/theory").rglob("*.json")]
    # the other theory jobs ran to the end (6 in the smoke DAG: 4 paper, the resident device's among them, 2
    # cache-aware)
    assert len(finished) == 5
    finished_at = {p: p.stat().st_mtime for p in finished}

    rerun = snakemake(workdir, *PROFILES, "reports/all")
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    comments = {job["comment"].split("_wildcards")[0] for job in jobs_of_run(rerun.stdout + rerun.stderr).values()}
    assert len(submissions(rerun.stdout + rerun.stderr)) == 2 and comments == {"rule_theory", "rule_report"}
    assert newest_mtime(decoded) == before
    assert {p: p.stat().st_mtime for p in finished} == finished_at
    assert len(list((workdir / "data/theory").rglob("*.json"))) == 6



def test_job_over_its_memory_request_is_killed_and_reported(smoke):
    """A job that asks for too little memory (here every job capped at 64 MB, SPECFIT_SLURM_MAX_MEM_MB) is killed
    by SLURM on the node; Snakemake names the job's SLURM log, which says why; a rerun with enough memory finishes
    it and submits nothing else."""
    workdir, _ = smoke
    theory = sorted((workdir / "data/theory").rglob("*.json"))[0]
    target = str(theory.relative_to(workdir))
    theory.unlink()
    proc = snakemake(workdir, *PROFILES, target, env={"SPECFIT_SLURM_MAX_MEM_MB": "64"}, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    [(job_id, log)] = submissions(output).items()
    assert jobs_of_run(output)[job_id]["mem"] == "64M"
    assert f"SLURM-job '{job_id}' failed" in output and log in output.split(f"SLURM-job '{job_id}' failed")[1]
    assert "exceeded memory limit" in Path(log).read_text(), Path(log).read_text()[-2000:]
    assert not theory.exists()

    rerun = snakemake(workdir, *PROFILES, target, timeout=600)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    assert len(submissions(rerun.stdout + rerun.stderr)) == 1
    assert theory.is_file()

def test_unknown_partition_fails_at_first_submission_with_slurms_message(smoke, tmp_path):
    workdir, _ = smoke
    shutil.rmtree(workdir / "reports/all", ignore_errors=True)
    started = time.monotonic()
    proc = snakemake(workdir, *PROFILES, "reports/all", env={"SPECFIT_SLURM_CPU_PARTITION": "nosuch"}, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "sbatch: error: invalid partition specified: nosuch" in output, output[-3000:]
    assert "Invalid partition name specified" in output
    assert not submissions(output)
    assert time.monotonic() - started < 120


def test_gpu_rule_asks_for_the_devices_gpu(root, workflow_copy, tmp_path):
    """On the paper's config (CUDA devices), a calibration job's sbatch asks the GPU partition for one GPU of its
    device's model. This SLURM has no GPU, so SLURM refuses it, after Snakemake printed the call."""
    workdir = workflow_copy(tmp_path)
    config = (root / "config.qwen3-30b-a3b.yaml").read_text()
    config = config.replace("/models/", f"{workdir}/models/")  # stand-in folders: the job never reads them
    (workdir / "smoke.yaml").write_text(config)
    for folder in ("Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B-Instruct-2507-speculator.eagle3"):
        (workdir / "models" / folder).mkdir(parents=True)
    prompts = workdir / "data/prompts/qwen3-30b-a3b/calibration.parquet"
    prompts.parent.mkdir(parents=True)
    prompts.write_bytes(b"")
    target = "data/calibration/qwen3-30b-a3b/rtx4090/cache.json"
    proc = snakemake(workdir, *PROFILES, target, "--verbose", timeout=300)
    output = proc.stdout + proc.stderr
    calls = [line for line in output.splitlines() if line.startswith("sbatch call: sbatch ")]
    assert len(calls) == 1, output[-3000:]
    assert " -p gpu " in calls[0] and " --gpus=rtx4090:1 " in calls[0], calls[0]
    assert proc.returncode != 0
    assert "sbatch: error: Invalid generic resource (gres) specification" in output


def test_local_script_refuses_taken_ports(root, tmp_path):
    """A second local SLURM on the ports the running one holds is refused, naming them."""
    if not (Path(os.environ.get("SLURM_CONF", "/nonexistent")).parent / "run/slurmctld.pid").is_file():
        pytest.skip("the SLURM up is not scripts/slurm-local.sh's")
    proc = subprocess.run([root / "scripts/slurm-local.sh", "up"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPECFIT_SLURM_DIR": str(tmp_path / "other")})
    ports = os.environ.get("SPECFIT_SLURM_PORTS", "6817,6818")
    assert proc.returncode != 0
    assert f"port(s) {ports} already in use" in proc.stderr
    assert not (tmp_path / "other").exists()

