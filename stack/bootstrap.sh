#!/usr/bin/env bash
# Installs what the local stack needs on this machine, then the Python venv from the lock.
# System packages come from Debian's packages (root only); Python packages from PyPI.
# Idempotent: a warm run only checks stamps.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
state=${TIDEMARK_STATE_DIR:-$root/.state}
venv=$state/venv
mkdir -p "$state"

say() { echo "[tidemark bootstrap] $*"; }

missing=()
command -v python3.11 >/dev/null || missing+=(python3.11)
python3.11 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3.11-venv)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)  # Maven compiles stack/java with it
command -v mvn >/dev/null || missing+=(maven)
command -v runuser >/dev/null || missing+=(util-linux)
command -v chromium >/dev/null || missing+=(chromium)  # the UI tests drive headless Chromium
command -v chromedriver >/dev/null || missing+=(chromium-driver)  # ... clicking through Selenium (tests/stack/test_ui_clicks.py)
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    say "missing: ${missing[*]}. Install them once as root: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  say "installing from Debian's packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q "${missing[@]}"
fi

java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [[ -z $java_major || $java_major -lt 17 ]]; then
  say "Java 17 or newer is needed (found '${java_major:-none}'): apt-get install openjdk-17-jdk-headless (Maven compiles stack/java with it)" >&2
  exit 1
fi

stamp=$venv/.requirements.sha256
want=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
if [[ ! -x $venv/bin/python ]]; then
  say "creating venv $venv"
  python3.11 -m venv "$venv"
fi
say "installing requirements.txt into $venv (pip caches downloads in its own cache)"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r "$root/requirements.txt"
"$venv/bin/python" -m pip check
echo "$want" > "$stamp"
