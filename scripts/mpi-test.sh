#!/usr/bin/env bash
# The MPI tests: tensors of the example extension through mpi4py on 2 ranks
# (examples/python-ext/tests/test_mpi.py, which runs mpi_worker.py under `mpiexec -n 2`).
# Needs the example module in ./.venv (scripts/test.sh builds it with maturin) and mpi4py and
# mpich from requirements-dev.txt (installed into ./.venv by scripts/env.sh). Fails, rather than
# skips, when MPI is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

echo "==> MPI: mpi4py on 2 ranks"
if ! timeout 60 .venv/bin/python -c 'import mpi4py, dlpack_example' >/dev/null; then
    echo "mpi-test: .venv lacks mpi4py or dlpack_example (run scripts/env.sh, then build the example)" >&2
    exit 1
fi
if [ ! -x .venv/bin/mpiexec ]; then
    echo "mpi-test: no .venv/bin/mpiexec (the mpich wheel of requirements-dev.txt installs it)" >&2
    exit 1
fi
timeout 60 .venv/bin/python -c 'import mpi4py; from mpi4py import MPI; print(f"mpi4py {mpi4py.__version__}:", MPI.Get_library_version().splitlines()[0])'
# pytest's last line is the summary, with the time taken.
timeout 600 .venv/bin/python -m pytest -v -p no:cacheprovider examples/python-ext/tests/test_mpi.py
