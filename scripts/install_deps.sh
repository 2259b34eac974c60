#!/usr/bin/env bash
# Installs the packages kdtree builds with, if any is missing (Debian/Ubuntu):
# cmake, ninja-build, g++, libfmt-dev, libcli11-dev, doctest-dev. Runs apt-get
# as root, or through sudo. The CUDA toolkit (NVRTC, cuda.h) is not a Debian
# package here: it is expected at $CUDA_HOME, default /usr/local/cuda.
set -euo pipefail

packages=(cmake ninja-build g++ libfmt-dev libcli11-dev doctest-dev)

if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "install_deps: installing ${missing[*]}"
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
      command -v sudo >/dev/null 2>&1 || {
        echo "install_deps: need root or sudo to install: ${missing[*]}" >&2
        exit 1
      }
      sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
  fi
else
  echo "install_deps: not a Debian system; make sure these are installed: ${packages[*]}" >&2
fi

cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -e "$cuda/include/nvrtc.h" ]; then
  echo "install_deps: no CUDA toolkit at $cuda (nvrtc.h missing); install it or set CUDA_HOME" >&2
  exit 1
fi
