#!/usr/bin/env bash
# Builds the Lattigo extension (Go package slotlattigo wrapped by gopy) and makes it
# importable from the project's virtual environment:
#
#     import slotlattigo.slotlattigo          # what backends/lattigo_backend.py does
#
# Called by `make lattigo` (and so by `make install`, `make test`). Idempotent: when the
# sources, the Go toolchain and the Python interpreter are unchanged since the last
# successful build it only re-checks the import and exits.
#
# Needs: Go >= 1.24 with cgo (a C compiler), the venv's Python with its headers, and the
# Go module proxy. Everything else is fetched at pinned versions:
#   - gopy v0.4.10 and goimports, built from tools/go.mod against golang.org/x/tools
#     v0.39.0 (`go install gopy@latest` does not work here, and the x/tools that gopy
#     pins does not compile with recent Go);
#   - pybindgen, pip-installed into the venv when missing.
#
# Layout (all ignored by git): build/bin (gopy, goimports), build/stamp, _gen/slotlattigo
# (the Python package gopy generates; "_" keeps it out of the Go tool's ./... patterns),
# and a slotplan_lattigo.pth in the venv's site-packages pointing at _gen.
#
# Usage: bash backends/lattigo/build.sh [--force]     (env VENV=... to use another venv)
#        bash backends/lattigo/build.sh --package DEST  (env PYTHON=...: the interpreter to build
#            for; builds under _genpkg, copies the package to DEST/slotlattigo, writes no .pth
#            and installs nothing: what `pip install .` runs through setup.py's build_py)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${VENV:-$root/.venv}
py=$venv/bin/python
bin=$here/build/bin
gen=$here/_gen
stamp=$here/build/stamp
force=0
package=
[ "${1:-}" = "--force" ] && force=1
if [ "${1:-}" = "--package" ]; then
  package=${2:?--package needs a destination directory}
  py=${PYTHON:?--package needs PYTHON=the interpreter to build for}
  gen=$here/_genpkg
  stamp=$here/build/pkg-stamp
fi

say() { echo "lattigo: $*"; }
die() { echo "lattigo: error: $*" >&2; exit 1; }

if [ -n "$package" ]; then
  command -v "$py" >/dev/null 2>&1 || die "no Python at $py"
else
  [ -x "$py" ] || die "no Python at $py: create the virtual environment first (make install)"
fi
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || die "the Go toolchain (go >= 1.24) is not on PATH"
command -v "${CC:-cc}" >/dev/null 2>&1 || die "no C compiler (${CC:-cc}) for cgo"

export CGO_ENABLED=1
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod"
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

if [ -z "$package" ]; then
  # Make the generated package importable from the venv (cheap; also repairs a moved repo).
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$gen" > "$site/slotplan_lattigo.pth"
fi

smoke() { PYTHONPATH="$gen${PYTHONPATH:+:$PYTHONPATH}" "$py" -c 'from slotlattigo import slotlattigo as m; print(m.Version())' 2>/dev/null; }
copy_package() {
  [ -n "$package" ] || return 0
  mkdir -p "$package"
  rm -rf "$package/slotlattigo"
  cp -R "$gen/slotlattigo" "$package/slotlattigo"
  say "copied the extension package to $package/slotlattigo"
}

fingerprint() {
  {
    cd "$here"
    # Sources that go into the extension, the tool pins, this script.
    ls ./*.go ./*.s go.mod go.sum tools/go.mod tools/go.sum build.sh | grep -v '_test\.go$' | sort | xargs sha256sum
    go version
    "$py" -c 'import sys; print(sys.version, sys.executable)'
  } | sha256sum | cut -d' ' -f1
}
want=$(fingerprint)

if [ "$force" = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && version=$(smoke); then
  say "up to date ($version)"
  copy_package
  exit 0
fi

start=$(date +%s)
say "building gopy and goimports (pinned in tools/go.mod)"
mkdir -p "$bin"
(cd "$here/tools" && go build -o "$bin/gopy" github.com/go-python/gopy \
                  && go build -o "$bin/goimports" golang.org/x/tools/cmd/goimports)

if ! "$py" -c 'import pybindgen' 2>/dev/null; then
  [ -z "$package" ] || die "pybindgen is not importable from $py (it is a build requirement: pip install pybindgen)"
  say "installing pybindgen into $venv"
  "$py" -m pip install -q 'pybindgen>=0.22'
fi

say "gopy build (Lattigo $(sed -n 's/.*tuneinsight\/lattigo\/v6 \(v[0-9.]*\).*/\1/p' "$here/go.mod"))"
# The package is built beside the one in use ($gen.new) and renamed into place once it
# imports: a Python process that starts meanwhile (a test worker, a CLI) finds the old package
# or the new one, never an empty or half-written directory. (site.py puts the .pth's directory
# on sys.path only if it exists when the interpreter starts: a build that removed $gen first
# left such a process without the extension for its whole life.)
rm -f "$stamp"
rm -rf "$gen.new" "$gen.old"
mkdir -p "$gen.new"
log=$here/build/gopy.log
# gopy must run inside the Go module it wraps, with its output inside that module too.
if ! (cd "$here" && PATH="$bin:$venv/bin:$PATH" "$bin/gopy" build -output="$gen.new/slotlattigo" -vm="$py" . >"$log" 2>&1); then
  tail -n 40 "$log" >&2
  rm -rf "$gen.new"
  die "gopy build failed (full log: $log)"
fi
# Build intermediates are not needed at run time.
rm -f "$gen.new/slotlattigo/"*.c "$gen.new/slotlattigo/"*.h "$gen.new/slotlattigo/"*.go \
      "$gen.new/slotlattigo/build.py" "$gen.new/slotlattigo/Makefile" "$gen.new/slotlattigo/slotlattigo_go.so"
gen_final=$gen
gen=$gen.new
version=$(smoke) || { rm -rf "$gen"; die "the extension was built but does not import from $py (see $log)"; }
gen=$gen_final
if [ -d "$gen" ]; then mv "$gen" "$gen.old"; fi
mv "$gen.new" "$gen"
rm -rf "$gen.old"
version=$(smoke) || die "the extension does not import from $gen after the move (see $log)"
echo "$want" > "$stamp"
say "built $version in $(( $(date +%s) - start )) s -> $gen/slotlattigo"
copy_package
