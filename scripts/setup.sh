#!/usr/bin/env bash
# Shared set-up for run.sh and test.sh (sourced): installs what is missing, configures and builds.
# Idempotent: a second call installs nothing and rebuilds incrementally.
set -euo pipefail
DSLAB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$DSLAB_ROOT/build}
VENV=${DSLAB_VENV:-$DSLAB_ROOT/.venv}

log() { printf '[dslab setup] %s\n' "$*" >&2; }

# A prebuilt bundle on a GPU machine (scripts/device_bundle.sh; its env.sh sets DSLAB_PREBUILT to the folder holding
# dslab): nothing to install or build there, and its system python3 draws the plots.
if [ -n "${DSLAB_PREBUILT:-}" ]; then
  BUILD_DIR=$DSLAB_PREBUILT
  PYTHON=${DSLAB_PYTHON:-python3}
  [ -x "$BUILD_DIR/dslab" ] || { log "DSLAB_PREBUILT=$BUILD_DIR holds no dslab"; exit 2; }
  return 0 2>/dev/null || exit 0
fi
PYTHON=$VENV/bin/python

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_apt_packages() {
  local wanted=(libdnnl-dev nlohmann-json3-dev libbenchmark-dev libgtest-dev libbenchmark-tools cmake g++ python3-venv ccache unzip liblzma-dev xz-utils)
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

# FlashInfer, the peer baseline of mla/flashinfer/cuda: header-only C++/CUDA, taken from the pinned flashinfer-python
# wheel on PyPI (checked against its SHA-256) and unpacked once per machine: its headers, the CUTLASS and CCCL headers
# they need. Skipped without nvcc (nothing would build it) or with DSLAB_FLASHINFER=off; a failed fetch leaves the
# variant unbuilt (dslab list says why), not the build broken.
FLASHINFER_PIN=0.7.2.post1
FLASHINFER_SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
FLASHINFER_DIR=${DSLAB_FLASHINFER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dslab/flashinfer-$FLASHINFER_PIN}
fetch_flashinfer() {
  [ "${DSLAB_FLASHINFER:-on}" != off ] || return 0
  [ ! -f "$FLASHINFER_DIR/include/flashinfer/attention/mla_hopper.cuh" ] || return 0
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  log "fetching flashinfer-python==$FLASHINFER_PIN (the headers of mla/flashinfer/cuda)"
  local tmp wheel
  tmp=$(mktemp -d)
  if "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
       "flashinfer-python==$FLASHINFER_PIN" -d "$tmp" >/dev/null 2>&1 &&
     wheel=$(ls "$tmp"/flashinfer_python-*.whl 2>/dev/null) &&
     echo "$FLASHINFER_SHA256  $wheel" | sha256sum -c --status; then
    rm -rf "$FLASHINFER_DIR.partial" && mkdir -p "$FLASHINFER_DIR.partial"
    unzip -q "$wheel" 'flashinfer/data/include/*' 'flashinfer/data/cutlass/include/*' 'flashinfer/data/cccl/libcudacxx/include/*' \
      'flashinfer/data/cccl/cub/*' 'flashinfer/data/cccl/thrust/thrust/*' -d "$FLASHINFER_DIR.partial"
    mv "$FLASHINFER_DIR.partial/flashinfer/data" "$FLASHINFER_DIR" && rm -rf "$FLASHINFER_DIR.partial"
  else
    log "could not fetch flashinfer-python==$FLASHINFER_PIN (or its checksum differs): mla/flashinfer/cuda is not built"
  fi
  rm -rf "$tmp"
}

# KTransformers' MoE kernels, the CPU MoE peers' library (scripts/peers/moe_kt.py): the pinned kt-kernel wheels from
# PyPI for CPython 3.11 and 3.12 (each checked against its SHA-256), of which only the extension modules the peers load
# (AMX, AVX-512 BF16 and AVX2 builds) and their bundled libraries are unpacked, once per machine: the peer loads the
# one of the interpreter it runs under (the device's Python need not be this machine's). A failed fetch leaves the
# peers skipping with the reason (DSLAB_KT_KERNEL=off: not fetched).
KT_KERNEL_PIN=0.7.2
KT_KERNEL_WHEELS="3.11:23dc85058bd88eecc1452274b986c82625e182f9323fb8b647b8d42517c69801
3.12:6345965091e3e562e21871ace08bd1d1228672ea433ad74ceafd4ae8a633eb80"
KT_KERNEL_DIR=${DSLAB_KT_KERNEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dslab/kt-kernel-$KT_KERNEL_PIN}
fetch_kt_kernel() {
  [ "${DSLAB_KT_KERNEL:-on}" != off ] && [ "$(uname -m)" = x86_64 ] || return 0
  local version sha tag tmp wheel
  for entry in $KT_KERNEL_WHEELS; do
    version=${entry%%:*} sha=${entry#*:} tag=${version/./}
    [ ! -f "$KT_KERNEL_DIR/kt_kernel/_kt_kernel_ext_avx2.cpython-$tag-x86_64-linux-gnu.so" ] || continue
    log "fetching kt-kernel==$KT_KERNEL_PIN for CPython $version (KTransformers' MoE kernels, the CPU MoE peers)"
    tmp=$(mktemp -d)
    if "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
         --platform manylinux_2_35_x86_64 --python-version "$version" "kt-kernel==$KT_KERNEL_PIN" -d "$tmp" \
         >/dev/null 2>&1 &&
       wheel=$(ls "$tmp"/kt_kernel-*.whl 2>/dev/null) && echo "$sha  $wheel" | sha256sum -c --status; then
      rm -rf "$tmp/unpacked" && mkdir -p "$tmp/unpacked" "$KT_KERNEL_DIR"
      unzip -q "$wheel" 'kt_kernel/_kt_kernel_ext_amx.*' 'kt_kernel/_kt_kernel_ext_avx512_bf16.*' \
        'kt_kernel/_kt_kernel_ext_avx2.*' 'kt_kernel.libs/*' -d "$tmp/unpacked"
      cp -r "$tmp/unpacked/." "$KT_KERNEL_DIR/"
    else
      log "could not fetch kt-kernel==$KT_KERNEL_PIN for CPython $version (or its checksum differs): its peers skip"
    fi
    rm -rf "$tmp"
  done
}

build() {
  local jobs flashinfer_arg=()
  jobs=$(nproc)
  [ -f "$FLASHINFER_DIR/include/flashinfer/attention/mla_hopper.cuh" ] && flashinfer_arg=(-DDSLAB_FLASHINFER_DIR="$FLASHINFER_DIR")
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ] ||
     { [ ${#flashinfer_arg[@]} -gt 0 ] && ! grep -q "^DSLAB_FLASHINFER_DIR:PATH=$FLASHINFER_DIR\$" "$BUILD_DIR/CMakeCache.txt"; }; then
    log "configuring $BUILD_DIR (Release)"
    cmake -S "$DSLAB_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "${flashinfer_arg[@]}" >/dev/null
  fi
  log "building with $jobs jobs"
  cmake --build "$BUILD_DIR" -j "$jobs" -- --no-print-directory 2>&1 | grep -Ev '^\[ *[0-9]+%\]' || true
  [ -x "$BUILD_DIR/dslab" ] || { log "build failed"; exit 1; }
}

# nvcc where the toolkit installs it, so CUDA is built on every machine that has it (the SASS guard runs in CI too).
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
install_apt_packages
install_python_requirements
fetch_flashinfer
fetch_kt_kernel
build
