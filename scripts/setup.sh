#!/usr/bin/env bash
# Installs what rstar2 needs on a Debian or Ubuntu machine, then the npm dependencies. Safe to re-run.
# Needed: bubblewrap, python3 with seccomp, numpy, sympy and jinja2, and PyTorch: Debian's python3-torch unless
# RSTAR2_PYTHON names an interpreter that has torch and numpy (a GPU machine's venv or conda). Optional:
# redis-server (the Redis-mode tests) and chromium (the dashboard's browser test): where one cannot be installed
# (Ubuntu ships Chromium as a snap, which a container cannot run), setup says so and the tests that need it are
# skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
need=(bubblewrap python3-seccomp python3-numpy python3-sympy python3-jinja2)
if [ -n "${RSTAR2_PYTHON:-}" ] && "$RSTAR2_PYTHON" -c 'import torch, numpy' 2>/dev/null; then
  echo "setup: the policy worker's torch is $RSTAR2_PYTHON's; python3-torch not installed" >&2
else
  need+=(python3-torch libopenblas0-pthread)
fi
optional=(redis-server chromium)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
install() { DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
  echo "setup: no apt-get here, so no system packages installed; rstar2 needs the equivalents of: ${need[*]}" >&2
else
  missing=()
  for p in "${need[@]}" "${optional[@]}"; do installed "$p" || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    # all at once is fastest; if that fails, one at a time, so that one package this system cannot give does not
    # keep the others out
    if ! install "${missing[@]}"; then
      for p in "${missing[@]}"; do
        installed "$p" || install "$p" && continue
        if [[ " ${optional[*]} " == *" $p "* ]]; then
          echo "setup: could not install $p (optional); the tests that need it are skipped" >&2
        else
          echo "setup: could not install $p, which rstar2 needs" >&2
          exit 1
        fi
      done
    fi
  fi
fi
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  # Not `npm ci`: the registry mirror here lacks biome's non-Linux optional binaries, and npm ci counts
  # those absent optional packages as a lock mismatch. `npm install` still installs the locked versions.
  npm install --no-audit --no-fund --loglevel=error
fi
