# Sourced by the other scripts: creates the project-local virtualenv ./.venv (once), installs
# requirements-dev.txt into it, and exports what pyo3 needs to build against it and to embed it.
# Uses `python3` from PATH (3.11 or newer, with a shared libpython), or $PYTHON if set.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.requirements-installed"

if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating $venv"
    "${PYTHON:-python3}" -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$root/requirements-dev.txt" -nt "$stamp" ]; then
    echo "==> installing requirements-dev.txt into $venv"
    # Without an inherited PYTHONPATH, which could make pip think the packages are installed, and
    # without pip's wheel cache, which would keep a second copy of torch's ~3 GB of wheels.
    env -u PYTHONPATH "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --no-cache-dir -r "$root/requirements-dev.txt"
    touch "$stamp"
fi

# pyo3 builds against this interpreter ...
export PYO3_PYTHON="$venv/bin/python"
# ... and the embedded interpreter (tests, quick start) finds libpython and the venv's packages.
libdir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
platsite="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$site:$platsite${PYTHONPATH:+:$PYTHONPATH}"
