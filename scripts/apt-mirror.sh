#!/usr/bin/env bash
# Prints the Debian archive URI this machine's apt is configured with (the
# first "deb" source serving bookworm's main suite, from deb822 .sources
# files or the one-line sources.list format), so that image builds use the
# same mirror as the host's packages and the project names none of its own.
# $DEBIAN_MIRROR, when set, wins. Exits 1 with a reason when there is none.
set -euo pipefail
if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; exit 0; fi
APT_DIR=${APT_DIR:-/etc/apt}
uri=""
shopt -s nullglob
for f in "$APT_DIR"/sources.list.d/*.sources; do
  # deb822 stanzas: a deb stanza whose Suites include "bookworm" itself.
  uri=$(awk '
    function flush() {
      if (types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && enabled != "no" && uris != "") {
        split(uris, u, " "); print u[1]; found = 1; exit
      }
      types = ""; suites = ""; uris = ""; enabled = ""
    }
    /^[[:space:]]*$/ { flush(); next }
    /^#/ { next }
    tolower($1) == "types:" { $1 = ""; types = $0 }
    tolower($1) == "suites:" { $1 = ""; suites = $0 }
    tolower($1) == "uris:" { $1 = ""; sub(/^ +/, ""); uris = $0 }
    tolower($1) == "enabled:" { enabled = tolower($2) }
    END { if (!found) flush() }
  ' "$f")
  [ -n "$uri" ] && break
done
if [ -z "$uri" ]; then
  for f in "$APT_DIR"/sources.list "$APT_DIR"/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1 == "deb" {
        i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
        if ($(i + 1) == "bookworm") { print $i; exit }
      }' "$f")
    [ -n "$uri" ] && break
  done
fi
if [ -z "$uri" ]; then
  echo "apt-mirror: no 'deb ... bookworm' source in $APT_DIR/sources.list{,.d}; set DEBIAN_MIRROR" >&2
  exit 1
fi
echo "${uri%/}"
