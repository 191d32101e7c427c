#!/usr/bin/env bash
# Unpacks every .deb in DEBS into DEST (dpkg -x, or ar + tar where there is
# no dpkg), once per set of files: a stamp in DEST records the listing, and
# an unchanged listing unpacks nothing. Used where nothing can be installed
# (scripts/gpu-run.sh, bench/gpu/run.sh on a GPU machine without a network).
# Usage: scripts/unpack-debs.sh DEBS DEST
set -euo pipefail
debs=$1
dest=$2
stamp=$dest/.unpacked
listing=$(cd "$debs" && ls -l -- *.deb)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$listing" ]; then exit 0; fi
rm -rf "$dest"
mkdir -p "$dest"
for deb in "$debs"/*.deb; do
  if command -v dpkg >/dev/null; then
    dpkg -x "$deb" "$dest"
  else
    # A .deb is an ar archive whose data.tar.* member holds the files.
    member=$(ar t "$deb" | grep '^data\.tar')
    ar p "$deb" "$member" >"$dest/.$member"
    tar -x -C "$dest" -f "$dest/.$member"
    rm -f "$dest/.$member"
  fi
done
printf '%s' "$listing" >"$stamp"
