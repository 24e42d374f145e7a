#!/usr/bin/env bash
# Installs those of the Debian packages named on the command line that are not installed yet
# (apt-get update first, as a fresh machine needs), as root or through sudo. Shared by setup.sh,
# fuzz.sh and setup_peers.sh.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # On stderr: the benchmarks that call setup_peers.sh read their peers' stdout.
  echo "install_packages: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
