"""Our tensors through MPI with mpi4py, on 2 ranks.

Runs `mpi_worker.py` once under `mpiexec -n 2` (the `mpiexec` beside this interpreter, which
the `mpich` wheel of requirements-dev.txt installs, else the one on PATH) and reports each of
its checks as a test; each check asserts on both ranks (values, errors, and that every export
MPI took was released by its deleter). The job must end within the timeout: a worker that
fails aborts the job (`MPI_Abort`) rather than leave the other rank waiting.

Launcher settings that work as root and without ssh: `HYDRA_LAUNCHER=fork` (MPICH's hydra
starts the ranks as local processes), and `OMPI_ALLOW_RUN_AS_ROOT{,_CONFIRM}=1` for an Open MPI
`mpiexec`. `scripts/mpi-test.sh` runs this file alone.
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="mpi4py is not installed (requirements-dev.txt has it)")

WORKER = Path(__file__).with_name("mpi_worker.py")
RANKS = 2
TIMEOUT = 300


def _mpiexec():
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec")

# The worker's checks, in the order it runs them (read from its source: importing it would
# initialize MPI in this process).
CHECKS = [
    node.name
    for node in ast.parse(WORKER.read_text()).body
    if isinstance(node, ast.FunctionDef) and node.name.startswith("check_")
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    logs = tmp_path_factory.mktemp("mpi")
    env = dict(
        os.environ,
        HYDRA_LAUNCHER="fork",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    command = [MPIEXEC, "-n", str(RANKS), sys.executable, str(WORKER), str(logs)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(
            f"the MPI job hung (no exit within {TIMEOUT} s): {command}\n"
            f"stdout: {hung.stdout!r}\nstderr: {hung.stderr!r}"
        )
    ranks = []
    for rank in range(RANKS):
        log = logs / f"rank{rank}.log"
        ranks.append(log.read_text() if log.exists() else "")
    output = f"status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result, ranks, output


def test_the_worker_has_checks():
    assert len(CHECKS) >= 8, CHECKS


def test_mpi_job_exits_cleanly(job):
    result, ranks, output = job
    assert result.returncode == 0, output
    for rank, log in enumerate(ranks):
        assert f"rank {rank}: all {len(CHECKS)} checks passed" in log, output


@pytest.mark.parametrize("check", CHECKS)
def test_mpi(job, check):
    result, ranks, output = job
    for rank, log in enumerate(ranks):
        failed = log.find(f"rank {rank}: FAIL {check}")
        if failed >= 0:
            pytest.fail(log[failed:], pytrace=False)
    for rank, log in enumerate(ranks):
        if f"rank {rank}: PASS {check}" not in log:
            if result.returncode != 0 and "FAIL" in "".join(ranks):
                pytest.skip("not reached: an earlier check failed and aborted the job")
            pytest.fail(f"not reached on rank {rank}\n{output}", pytrace=False)
