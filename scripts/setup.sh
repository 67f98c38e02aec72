#!/usr/bin/env bash
# Installs everything rstar2 needs on a fresh Debian 12 machine: system packages (sandbox isolation,
# PyTorch, Redis, Chromium for the dashboard test) and the npm dependencies. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(bubblewrap python3-seccomp redis-server python3-torch libopenblas0-pthread python3-numpy python3-sympy python3-jinja2 chromium)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  # Not `npm ci`: the registry mirror here lacks biome's non-Linux optional binaries, and npm ci counts
  # those absent optional packages as a lock mismatch. `npm install` still installs the locked versions.
  npm install --no-audit --no-fund --loglevel=error
fi
