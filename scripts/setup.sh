#!/usr/bin/env bash
# Shared set-up for run.sh and test.sh (sourced): installs what is missing, configures and builds.
# Idempotent: a second call installs nothing and rebuilds incrementally.
set -euo pipefail
DSLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$DSLAB_ROOT/build}
VENV=${DSLAB_VENV:-$DSLAB_ROOT/.venv}

log() { printf '[dslab setup] %s\n' "$*" >&2; }

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_apt_packages() {
  local wanted=(libdnnl-dev nlohmann-json3-dev libbenchmark-dev libgtest-dev libbenchmark-tools cmake g++ python3-venv ccache)
  local missing=()
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_python_requirements() {
  # A virtual environment: system Pythons refuse global pip installs (PEP 668).
  local req="$DSLAB_ROOT/scripts/requirements.txt" stamp="$VENV/.requirements.stamp"
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    log "pip install -r scripts/requirements.txt"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
    cp "$req" "$stamp"
  fi
}

build() {
  local jobs
  jobs=$(nproc)
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    log "configuring $BUILD_DIR (Release)"
    cmake -S "$DSLAB_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  log "building with $jobs jobs"
  cmake --build "$BUILD_DIR" -j "$jobs" -- --no-print-directory 2>&1 | grep -Ev '^\[ *[0-9]+%\]' || true
  [ -x "$BUILD_DIR/dslab" ] || { log "build failed"; exit 1; }
}

install_apt_packages
install_python_requirements
build
