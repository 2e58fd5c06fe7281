#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on 127.0.0.1 (for studies shared by several `arag tune` workers,
# and the test that runs two of them) and print its URL, e.g. postgresql://arag@127.0.0.1:40123/arag.
#
# Installs the Debian package when PostgreSQL is missing and this runs as root with apt-get.
# Idempotent: while the server runs, a second call prints the same URL. The data, socket, log and
# port live in $ARAG_PG_DIR (default /tmp/arag-postgres); `pg_ctl -D $ARAG_PG_DIR/data stop` ends it.
# The server never runs as root: as root it runs as the package's `postgres` user.
#
#   export ARAG_TEST_POSTGRES_URL="$(scripts/start-postgres.sh)"
set -euo pipefail

dir="${ARAG_PG_DIR:-/tmp/arag-postgres}"
database=arag
role=arag

server_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

bin="$(server_bin)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q postgresql >&2 || { apt-get update -q >&2 && apt-get install -y -q postgresql >&2; }
        bin="$(server_bin)"
    fi
fi
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "start-postgres: PostgreSQL is not installed (as root: apt-get install postgresql)" >&2
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    owner=postgres
    run() { runuser -u "$owner" -- "$@"; }
else
    owner="$(id -un)"
    run() { "$@"; }
fi

url() { echo "postgresql://$role@127.0.0.1:$(cat "$dir/port")/$database"; }

if [ -f "$dir/port" ] && run "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
    url
    exit 0
fi

mkdir -p "$dir"
chown "$owner" "$dir"
chmod 700 "$dir"
if [ ! -f "$dir/data/PG_VERSION" ]; then
    run "$bin/initdb" -D "$dir/data" -U "$role" --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        exit 1
    }
fi

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
run "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir" start >&2 || {
    cat "$dir/server.log" >&2
    exit 1
}
echo "$port" >"$dir/port"
if ! run "$bin/psql" -h 127.0.0.1 -p "$port" -U "$role" -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$database'" | grep -q 1; then
    run "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$role" "$database"
fi
url
