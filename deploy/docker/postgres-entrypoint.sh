#!/bin/sh
# Makes the cluster on first start, then runs the server (see the image's
# header). Fails, with why, rather than start without a password.
set -eu
: "${PGDATA:=/var/lib/postgresql/data/pgdata}"
bin=/usr/lib/postgresql/15/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=${LOOM_POSTGRES_PASSWORD_FILE:-}
  if [ -z "$pw" ] || [ ! -s "$pw" ]; then
    echo "loom-postgres: no password: set LOOM_POSTGRES_PASSWORD_FILE to the Secret's file" >&2
    exit 1
  fi
  mkdir -p "$PGDATA"
  chmod 0700 "$PGDATA"
  "$bin/initdb" -D "$PGDATA" -U loom --pwfile="$pw" --auth-local=peer --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "host all all ::/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  "$bin/postgres" --single -D "$PGDATA" postgres <<SQL >/dev/null
CREATE DATABASE loom;
SQL
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c "port=${LOOM_POSTGRES_PORT:-5432}" \
  -c unix_socket_directories=/var/run/postgresql
