#!/usr/bin/env bash
# Fetches and configures the source of the installed fio (Debian ships no fio-dev), so that
# fio/rdmx-engine.so is built against the headers of the very fio that loads it.
# Idempotent: does nothing when fio/src/ already holds a configured tree of that version.
# Prints the source directory on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/src"
ver=$(dpkg-query -W -f='${Version}' fio 2>/dev/null || true)
if [ -z "$ver" ]; then
  echo "fio-src: fio is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$ver" ] && [ -f "$dest/config-host.h" ]; then
  echo "$dest"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# A deb-src entry for the suites the binary packages come from (apt-get source needs one).
srcs=/etc/apt/sources.list.d/rdmx-deb-src.sources
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  echo "fio-src: adding $srcs" >&2
  $SUDO tee "$srcs" >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
fi
work=$(mktemp -d "$here/.src-XXXXXX")
trap 'rm -rf "$work"' EXIT
# dpkg-source applies Debian's patches, as in the installed fio.
( cd "$work" && apt-get source -q --download-only "fio=$ver" >&2 && dpkg-source -x ./*.dsc tree >&2 ) || true
if [ ! -d "$work/tree" ]; then
  echo "fio-src: apt-get source fio=$ver failed" >&2
  exit 1
fi
( cd "$work/tree" && ./configure --disable-native >&2 )
rm -rf "$dest"
mv "$work/tree" "$dest"
echo "$ver" >"$dest/.version"
echo "$dest"
