"""The stage launcher: a stage run by a child of the stage server writes what the same stage writes in a process of
its own (outputs, exit status, log), and the launcher runs a stage itself where the server cannot."""

import json
import os
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from specfit.launch import SOCKET_ENV, THREAD_VARS

EMULATE = {"name": "A100", "fixed_ms": 74.02, "token_ms": 1.423, "expert_ms": 4.786, "copy_ms": 4.575,
           "draft_ms": 10.24}
SPEC = {"method": {"name": "eagle3"}, "slots": 4, "max_inflight": 2, "link": None, "emulate": EMULATE,
        "torch_device": "cpu", "dtype": "float32", "limit_tokens": 40, "max_new_tokens": 12, "seed": 0,
        "warmup_tokens": 3, "model": "tiny", "logits_dtype": "model", "verify": "exact"}
ONE_THREAD = dict.fromkeys(THREAD_VARS, "1")  # as Snakemake sets them for a job of one thread


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("server")
    path, log = str(folder / "s.sock"), folder / "server.log"
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | ONE_THREAD
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "specfit.launch", "--serve", path, str(os.getpid())],
                                stdout=out, stderr=out, env=env)
    for _ in range(600):  # it imports torch, transformers and numba first
        if os.path.exists(path + ".pid"):
            break
        time.sleep(0.1)
    yield path, log
    proc.terminate()
    proc.wait(timeout=30)
    assert not os.path.exists(path)  # it leaves no socket behind


def launch(stage, spec, files, outs, env, log):
    argv = [sys.executable, "-m", "specfit.launch", stage, "--spec", json.dumps(spec),
            *(f"--in={k}={v}" for k, v in files.items()), *(f"--out={k}={v}" for k, v in outs.items())]
    argv = [a for arg in argv for a in (arg.split("=", 1) if arg.startswith(("--in=", "--out=")) else [arg])]
    with open(log, "w") as out:
        return subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=300).returncode


def outputs(folder):
    return {k: folder / f"{k}.{e}" for k, e in (("requests", "parquet"), ("cycles", "parquet"), ("metrics", "json"))}


def test_a_stage_in_the_server_writes_what_it_writes_alone(server, files, tmp_path):
    path, server_log = server
    base = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | ONE_THREAD
    runs = {}
    for name, env in (("alone", base), ("served", base | {SOCKET_ENV: path})):
        (tmp_path / name).mkdir()
        out = outputs(tmp_path / name)
        assert launch("decode", SPEC, files, out, env, tmp_path / name / "log") == 0
        runs[name] = out
    assert server_log.read_text().count("decode: child") == 1  # the served one ran in a child of the server
    for name in runs:  # the stream's progress went where its launcher's output goes, served or not
        assert "eagle3: 100%" in (tmp_path / name / "log").read_text()
    for table in ("requests", "cycles"):
        alone, served = (pq.read_table(runs[n][table]).to_pydict() for n in ("alone", "served"))
        timing = [k for k in alone if k.startswith("t_")]  # the host's share of the virtual clock is measured
        assert {k: v for k, v in alone.items() if k not in timing} == {
            k: v for k, v in served.items() if k not in timing}
    alone, served = (json.loads(runs[n]["metrics"].read_text()) for n in ("alone", "served"))
    for key in ("n_output_tokens", "cycles", "committed_per_cycle", "draft_nodes_per_cycle", "h2d_per_token",
                "experts_executed", "verify_widths", "lossless"):
        assert alone[key] == served[key], key
    assert alone["device"]["target"]["modelled_s"] == served["device"]["target"]["modelled_s"]


def test_a_failing_stage_fails_the_same_in_the_server(server, files, tmp_path):
    """A stage that raises (a bad slot count: an exception, exit 1 and its traceback) or refuses its spec (exit 2 and
    the error line) ends the same served as alone: the same status, the same last line in its log."""
    path, _ = server
    alone = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | ONE_THREAD
    for name, spec, code in (("raises", dict(SPEC, slots="four"), 1),
                             ("refused", dict(SPEC, method={"name": "no-such-kind"}), 2)):
        last = {}
        for how, env in (("alone", alone), ("served", alone | {SOCKET_ENV: path})):
            log = tmp_path / f"{name}.{how}.log"
            assert launch("decode", spec, files, outputs(tmp_path), env, log) == code, (name, how)
            last[how] = log.read_text().strip().splitlines()[-1]
        assert last["alone"] == last["served"], name
        if code == 2:
            assert last["served"].startswith("error: unknown method kind 'no-such-kind'")


def test_other_threads_or_no_server_run_the_stage_in_the_launcher(server, files, tmp_path):
    path, server_log = server
    before = server_log.read_text().count(": child")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | dict.fromkeys(THREAD_VARS, "2")
    assert launch("decode", SPEC, files, outputs(tmp_path / "a"), env | {SOCKET_ENV: path}, tmp_path / "l1") == 0
    assert launch("decode", SPEC, files, outputs(tmp_path / "b"), env | {SOCKET_ENV: str(tmp_path / "none.sock")},
                  tmp_path / "l2") == 0
    assert server_log.read_text().count(": child") == before
    assert (tmp_path / "a" / "metrics.json").is_file() and (tmp_path / "b" / "metrics.json").is_file()


def test_a_served_job_ends_with_its_launcher(server, files, tmp_path):
    """Snakemake kills a job by killing its launcher: the server's child that runs it ends too and writes nothing."""
    path, server_log = server
    before = server_log.read_text().count("decode: child")
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | ONE_THREAD | {SOCKET_ENV: path}
    spec = dict(SPEC, limit_tokens=400, max_new_tokens=300)  # long enough to be killed while it runs
    argv = [sys.executable, "-m", "specfit.launch", "decode", "--spec", json.dumps(spec),
            *(a for k, v in files.items() for a in ("--in", f"{k}={v}")),
            *(a for k, v in outputs(tmp_path).items() for a in ("--out", f"{k}={v}"))]
    with open(tmp_path / "log", "w") as out:
        launcher = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    child = None
    for _ in range(600):
        lines = [line for line in server_log.read_text().splitlines() if line.startswith("decode: child")]
        if len(lines) > before:
            child = int(lines[-1].split()[-1])
            break
        time.sleep(0.05)
    assert child is not None and launcher.poll() is None, "the served job did not start"
    os.kill(child, 0)  # running
    launcher.kill()
    launcher.wait(timeout=30)
    for _ in range(200):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the server's child {child} outlived its launcher")
    assert not any(f.exists() for f in outputs(tmp_path).values())


def test_the_workflow_starts_and_stops_its_server(tmp_path, monkeypatch):
    """The Snakefile's handlers: `start` puts the socket in a folder of its own and its path in the jobs'
    environment; `stop` ends the server and removes the folder; SPECFIT_STAGE_SERVER=0 starts none."""
    from specfit import launch

    monkeypatch.setenv(SOCKET_ENV, "0")
    assert launch.start(str(tmp_path / "none.log")) is None
    monkeypatch.delenv(SOCKET_ENV)
    path = launch.start(str(tmp_path / "server.log"))
    assert os.environ[SOCKET_ENV] == path and oct(os.stat(os.path.dirname(path)).st_mode)[-3:] == "700"
    for _ in range(600):
        if os.path.exists(path + ".pid"):
            break
        time.sleep(0.1)
    assert os.path.exists(path)
    launch.stop()
    assert SOCKET_ENV not in os.environ and not os.path.exists(os.path.dirname(path))


def test_a_stage_that_trains_or_does_not_import_runs_in_the_launcher(server, tmp_path):
    """The server declines a training stage (its ``main.trains``: its own numerics, its own process) and a stage that
    does not import: the launcher runs each, and its error lands in the job's own log."""
    path, server_log = server
    before = server_log.read_text().count(": child")
    env = {k: v for k, v in os.environ.items() if k != SOCKET_ENV} | ONE_THREAD | {SOCKET_ENV: path}
    assert launch("toy_tokenizer", {}, {}, {"tokenizer": tmp_path / "tok"}, env, tmp_path / "train.log") != 0
    assert (tmp_path / "train.log").read_text().strip()  # the stage's own error, in its log
    assert launch("no_such_stage", {}, {}, {}, env, tmp_path / "none.log") != 0
    assert "No module named 'specfit.stages.no_such_stage'" in (tmp_path / "none.log").read_text()
    assert server_log.read_text().count(": child") == before  # neither ran in a child of the server
