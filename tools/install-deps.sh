#!/usr/bin/env bash
# Installs the Debian packages slideformer needs, if any is missing (needs root, or sudo).
set -euo pipefail
pkgs=(cmake ninja-build g++ make pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev libgtest-dev libutf8proc-dev liburing-dev
      clang libclang-rt-14-dev)  # clang + libFuzzer: make fuzz, make fuzz-smoke (CI)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
