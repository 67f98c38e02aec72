#!/usr/bin/env bash
# Installs what rstar2 needs on a Debian or Ubuntu machine: the system packages, a Python venv for the policy
# worker (.venv, from python/requirements.txt), then the npm dependencies. Safe to re-run.
# System packages: bubblewrap, python3 with seccomp, numpy and sympy (the sandbox runs /usr/bin/python3, the only
# interpreter it mounts) and python3-venv. Optional: redis-server (the Redis-mode tests) and chromium (the
# dashboard's browser test): where one cannot be installed (Ubuntu ships Chromium as a snap, which a container
# cannot run), setup says so and the tests that need it are skipped.
# The venv gets PyTorch's CPU build where there is no GPU and its CUDA build where there is one. RSTAR2_PYTHON
# naming an interpreter that has torch (a conda env, a cluster's module) skips the venv; RSTAR2_VENV moves it.
set -euo pipefail
cd "$(dirname "$0")/.."
need=(bubblewrap python3-seccomp python3-numpy python3-sympy python3-jinja2 python3-venv)
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

req=python/requirements.txt
venv=${RSTAR2_VENV:-.venv}
# "name==version" of each pinned package the interpreter $1 lacks, one a line (none: all installed as pinned)
lacking() {
  "$1" - "$req" <<'PY'
import re, sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    m = re.match(r"\s*([A-Za-z0-9_.-]+)==([^\s#;]+)", line)
    if not m:
        continue
    try:
        have = version(m[1])
    except PackageNotFoundError:
        have = None
    if have is None or have.split("+")[0] != m[2]:  # 2.13.0+cpu is torch==2.13.0
        print(f"{m[1]}=={m[2]}")
PY
}
# A package index pip cannot reach costs minutes of retries per package; find that out in seconds and use the
# first local (file://) index the machine's pip configuration names instead.
reachable() {
  case $1 in
    file://*) [ -d "${1#file://}" ] ;;
    *) "$py" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" >/dev/null 2>&1 ;;
  esac
}
pip_index_args() {
  local conf index local_index=""
  conf=$("$py" -m pip config list 2>/dev/null || true)
  index=${PIP_INDEX_URL:-$(sed -n "s/^global\.index-url='\(.*\)'$/\1/p" <<<"$conf")}
  index=${index:-https://pypi.org/simple}
  for u in ${PIP_EXTRA_INDEX_URL:-} $(sed -n "s/^global\.extra-index-url='\(.*\)'$/\1/p" <<<"$conf"); do
    [[ -z $local_index && $u == file://* && -d ${u#file://} ]] && local_index=$u
  done
  if reachable "$index"; then
    pip_args=()
    online=1
  elif [ -n "$local_index" ]; then
    echo "setup: pip's index $index cannot be reached; using the local index $local_index" >&2
    pip_args=(--index-url "$local_index" --retries 0 --timeout 10)
    online=0
  else
    echo "setup: pip's index $index cannot be reached and no local index is configured: set PIP_INDEX_URL" \
      "to one that can be, or RSTAR2_PYTHON to an interpreter that has torch" >&2
    exit 1
  fi
}
has_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

if [ -n "${RSTAR2_PYTHON:-}" ]; then
  if ! "$RSTAR2_PYTHON" -c 'import torch, numpy' 2>/dev/null; then
    echo "setup: RSTAR2_PYTHON=$RSTAR2_PYTHON cannot import torch and numpy; install them there or unset it" >&2
    exit 1
  fi
  echo "setup: the policy worker runs $RSTAR2_PYTHON (RSTAR2_PYTHON); no venv made" >&2
else
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  py=$venv/bin/python
  todo=$(lacking "$py")
  if [ -z "$todo" ]; then
    echo "setup: $venv is up to date with $req" >&2
  else
    echo "setup: installing into $venv: $(tr '\n' ' ' <<<"$todo")" >&2
    pip_index_args
    torch_pin=$(grep -m1 '^torch==' "$req")
    if [[ $todo == *torch==* && $online == 1 ]] && ! has_gpu; then
      # PyPI's Linux torch is the CUDA build (gigabytes of libraries a CPU machine never loads)
      "$py" -m pip install -q --index-url https://download.pytorch.org/whl/cpu "$torch_pin"
    fi
    # a local index warns of every package it does not hold, though another index gives it
    "$py" -m pip install -q "${pip_args[@]}" -r "$req" 2> >(grep -v 'is ignored: it is neither a file nor' >&2)
    left=$(lacking "$py")
    if [ -n "$left" ]; then
      echo "setup: pip finished but $venv still lacks: $(tr '\n' ' ' <<<"$left")" >&2
      exit 1
    fi
  fi
  "$py" - <<'PY' >&2
import platform
from importlib.metadata import version
import torch
build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
print(f"setup: the policy worker runs python {platform.python_version()}, torch {torch.__version__} ({build}),",
      f"transformers {version('transformers')}")
PY
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  # Not `npm ci`: the registry mirror here lacks biome's non-Linux optional binaries, and npm ci counts
  # those absent optional packages as a lock mismatch. `npm install` still installs the locked versions.
  npm install --no-audit --no-fund --loglevel=error
fi
