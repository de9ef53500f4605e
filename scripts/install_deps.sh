#!/usr/bin/env bash
# Installs slotplan and its dependencies ('.[dev,all]') into the virtual environment VENV
# (first argument, made by `make install`) and builds the Lattigo extension beside it.
#
# The installer is uv (from PyPI, installed into the venv by pip): it resolves, downloads and
# unpacks the ~1 GB of wheels in ~10 s on this 2-core machine, where pip took 90-190 s (one
# core; docs/testing.md). Where uv cannot be installed or its install fails, pip does the same
# install. Neither byte-compiles: compileall then compiles the venv on every core, beside the
# Lattigo build (leaving modules to be compiled on import cost more than it saved: the first
# test run's processes each compiled what they imported, +190 s of pytest).
# uv is told what pip is told through the environment: PIP_INDEX_URL, PIP_EXTRA_INDEX_URL and
# PIP_FIND_LINKS; it reads the system's certificates (--native-tls), as pip does here.
#
# The Lattigo build (gopy, one core, ~28 s) needs only pybindgen from the venv: it runs beside
# the main install and the compile, and its output is printed after.
set -uo pipefail

venv=${1:?usage: install_deps.sh VENV}
py=$venv/bin/python
uv=$venv/bin/uv

uv_args=(--python "$py" -q --native-tls)
[ -n "${PIP_INDEX_URL:-}" ] && uv_args+=(--index-url "$PIP_INDEX_URL")
[ -n "${PIP_EXTRA_INDEX_URL:-}" ] && uv_args+=(--extra-index-url "$PIP_EXTRA_INDEX_URL")
for links in ${PIP_FIND_LINKS:-}; do uv_args+=(--find-links "$links"); done

use_uv=0
if "$py" -m pip install -q uv >/dev/null 2>&1 && "$uv" --version >/dev/null 2>&1; then
    use_uv=1
else
    echo "install_deps: uv is not available here; installing with pip"
fi

# install ARGS...: with uv, else (or where uv fails) with pip
install() {
    if [ "$use_uv" = 1 ]; then
        echo "uv pip install $*"
        "$uv" pip install "${uv_args[@]}" "$@" && return 0
        echo "install_deps: uv failed; trying pip"
    fi
    echo "pip install $*"
    "$py" -m pip install -q --no-compile "$@"
}

install --upgrade pip 'pybindgen>=0.22' || { echo "make: installing pip and pybindgen failed"; exit 1; }
echo "bash backends/lattigo/build.sh &  (beside the install below)"
bash backends/lattigo/build.sh > "$venv/lattigo-build.log" 2>&1 &
build=$!
install -e '.[dev,all]'
pip_rc=$?
if [ "$pip_rc" = 0 ]; then
    # byte-code for every installed module, on every core, while the Lattigo build goes on
    # (-qq: some packages ship files that are not Python 3, which pip skips silently too)
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "python -m compileall -qq -j 0 $site"
    "$py" -m compileall -qq -j 0 "$site" || true
fi
wait "$build"
build_rc=$?
cat "$venv/lattigo-build.log"
[ "$pip_rc" = 0 ] || { echo "make: installing slotplan's dependencies failed"; exit 1; }
[ "$build_rc" = 0 ] || { echo "make: the Lattigo build failed (above)"; exit 1; }
