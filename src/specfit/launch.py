"""How a rule runs its stage: ``python -m specfit.launch <stage> --spec JSON --in k=path --out k=path``.

A stage's process spends seconds importing torch, transformers and numba before it computes anything, and the DAG runs
dozens of them. On a local run the workflow starts a stage server (`serve`, from the Snakefile's ``onstart``) that
imports them once; each job's launcher (`main`) then hands its arguments, working directory, environment and open
stdout / stderr to the server, which forks a child that runs the stage exactly as a fresh process would (the same
``main`` of `specfit.planning.stage`) and returns its exit status. Where there is no server (a cluster job, a test, a
command line of your own), or the job's environment asks for other threads than the server was started with, or the
server is gone, or the stage trains, the launcher runs the stage in its own process. Both paths run the same code on
the same inputs: the tests compare their outputs.

The server imports the libraries and compiles the selector's numba kernels, and computes no tensor before it forks, with
the timing stages' numerics (`specfit.numerics.for_timing`) and the jobs' thread variables set; a stage that trains
(its ``main.trains``, `specfit.planning.stage.stage_main`) always runs in its own process, with the training
numerics. The server exits with the workflow (its parent process) or when told to (`stop`).
"""

from __future__ import annotations

import importlib
import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback

SOCKET_ENV = "SPECFIT_STAGE_SERVER"  # the server's socket path, in the jobs' environment
THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")  # what Snakemake sets per job from its threads
PRELOAD = ("torch", "transformers", "numba", "numpy", "pyarrow.parquet", "scipy.optimize", "safetensors.torch",
           "specfit.stages.extract", "specfit.stages.calibrate", "specfit.stages.atlas", "specfit.stages.decode",
           "specfit.stages.tune", "specfit.stages.tune_choice", "specfit.stages.theory", "specfit.stages.report")
_HEADER = struct.Struct("!Q")  # the request's length, sent with the job's stdin, stdout and stderr


def run_here(stage: str, argv: list[str]) -> int:
    """The stage in this process: its module's ``main`` (`specfit.planning.stage.stage_main`)."""
    try:
        importlib.import_module(f"specfit.stages.{stage}").main(argv)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else _said(done.code))
    return 0


def _said(message) -> int:
    print(message, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        raise SystemExit("usage: python -m specfit.launch <stage> --spec JSON --in name=path --out name=path")
    stage, args = argv[0], argv[1:]
    path = os.environ.get(SOCKET_ENV)
    if path:
        code = _via_server(path, stage, args)
        if code is not None:
            sys.exit(code)
    sys.exit(run_here(stage, args))


def _via_server(path: str, stage: str, args: list[str]) -> int | None:
    """The stage's exit status from the server, or None where the server cannot run it (none there, other threads, a
    stage that trains or does not import)."""
    body = json.dumps({"stage": stage, "argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    sys.stdout.flush()
    sys.stderr.flush()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with conn:
        try:
            conn.connect(path)
            socket.send_fds(conn, [_HEADER.pack(len(body))], [0, 1, 2])
            conn.sendall(body)
        except OSError:  # no server there (or it is gone): nothing ran
            return None
        reply = b""
        try:
            while chunk := conn.recv(4096):
                reply += chunk
        except OSError:
            pass
    if not reply:  # the child died without a word: the job failed (its log says why)
        return _said(f"the stage server's child ended without an exit status ({path})")
    return json.loads(reply)["exit"]


def serve(path: str, parent: int) -> None:
    """Import the stages' libraries, then fork a child per job until ``parent`` exits or `stop` is called."""
    from specfit import numerics

    numerics.for_timing()  # as every timing stage sets it before its first GEMM
    for name in PRELOAD:
        importlib.import_module(name)
    from specfit.selection.search import compile_kernels

    compile_kernels()  # the selector's numba kernels (no tensor): each child's warm-up finds them compiled
    threads = {k: os.environ.get(k) for k in THREAD_VARS}
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    with open(path + ".pid", "w") as f:
        f.write(str(os.getpid()))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while _alive(parent):
            if not select.select([server], [], [], 1.0)[0]:
                continue
            conn, _ = server.accept()
            if os.fork() == 0:  # the child: one job
                server.close()
                _child(conn, threads)
            conn.close()
    finally:
        server.close()
        for leftover in (path, path + ".pid"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _child(conn: socket.socket, threads: dict) -> None:
    """Run one job with the launcher's stdin, stdout, stderr, directory and environment; send its exit status."""
    code = 1
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the stage's own subprocesses are waited for as in its own process
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        head, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
        size, body = _HEADER.unpack(head)[0], b""
        while len(body) < size:
            body += conn.recv(size - len(body))
        job = json.loads(body)
        if {k: job["env"].get(k) for k in THREAD_VARS} != threads or not _servable(job["stage"]):
            conn.sendall(json.dumps({"exit": None}).encode())
            os._exit(0)
        print(f"{job['stage']}: child {os.getpid()}", flush=True)  # the server's log: which jobs it ran
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        threading.Thread(target=_watch, args=(conn,), daemon=True).start()
        code = run_here(job["stage"], job["argv"])
    except BaseException:  # noqa: BLE001 - whatever the stage raised goes to its log, as in its own process
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.sendall(json.dumps({"exit": code}).encode())
        finally:
            os._exit(code)


def _servable(stage: str) -> bool:
    """Whether a child of the server runs ``stage``: not one that trains (its own numerics, so its own process), nor
    one that does not import (the launcher, running it, says why in the job's log). Importing it computes nothing."""
    try:
        return not importlib.import_module(f"specfit.stages.{stage}").main.trains
    except Exception:  # noqa: BLE001 - any import error is the launcher's to report
        return False


def _watch(conn: socket.socket) -> None:
    """End the job when its launcher is gone (Snakemake killed it): nothing is left running on its behalf."""
    select.select([conn], [], [])
    if not conn.recv(1, socket.MSG_PEEK):
        os._exit(1)


def start(log: str) -> str | None:
    """Start a stage server for this process's jobs (the Snakefile's onstart, local runs only) with the thread variables
    Snakemake gives a job of one thread, logging to ``log``; returns its socket path, also set in this process's
    environment (`SOCKET_ENV`) for the jobs to inherit. None where ``SPECFIT_STAGE_SERVER=0`` asks for none."""
    import subprocess
    import tempfile

    if os.environ.get(SOCKET_ENV) == "0":
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="specfit-stages-"), "server.sock")  # a folder only this user opens
    env = dict(os.environ, **dict.fromkeys(THREAD_VARS, "1"))
    env.pop(SOCKET_ENV, None)
    os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
    with open(log, "a") as out:
        subprocess.Popen([sys.executable, "-m", "specfit.launch", "--serve", path, str(os.getpid())], stdout=out,
                         stderr=out, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    os.environ[SOCKET_ENV] = path
    return path


def stop() -> None:
    """Ask this process's stage server to exit (the Snakefile's onsuccess / onerror); nothing if none runs."""
    path = os.environ.pop(SOCKET_ENV, None)
    if not path or path == "0" or not os.path.exists(path + ".pid"):
        return
    try:
        os.kill(int(open(path + ".pid").read()), signal.SIGTERM)
    except (ProcessLookupError, ValueError):
        pass
    for _ in range(50):  # it removes its socket and pid file, then the folder goes
        if not os.path.exists(path):
            break
        time.sleep(0.1)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        main()
