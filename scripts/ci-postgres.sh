#!/usr/bin/env bash
# Makes a PostgreSQL server available to the storage and domain test suites.
#
#   eval "$(scripts/ci-postgres.sh)"
#
# Installs Debian's `postgresql` package if it is missing, creates (once) a cluster
# named `loadout` on a free loopback port with UTF-8 encoding, starts it, creates a
# role and a database with a password, and prints `export` lines on stdout:
#   LOADOUT_TEST_POSTGRES_URL   the database URL (the role may create databases:
#                               each test makes its own and drops it; and roles:
#                               the scratchpad's query role)
#   LOADOUT_TEST_PG_STOP_CMD    stops the cluster (the reconnect test runs it)
#   LOADOUT_TEST_PG_START_CMD   starts it again
# Everything else goes to stderr. Idempotent: a second run finds the cluster, starts
# it if it is down and prints the same lines. Must run as root (Debian's cluster
# tools switch to the `postgres` user themselves).
set -euo pipefail

CLUSTER="${LOADOUT_PG_CLUSTER:-loadout}"
ROLE="${LOADOUT_PG_ROLE:-loadout_test}"
PASSWORD="${LOADOUT_PG_PASSWORD:-loadout_test}"
DATABASE="${LOADOUT_PG_DATABASE:-loadout_test}"

log() { echo "ci-postgres: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root (installs packages and manages a cluster as the postgres user)"
    exit 1
fi

installed_version() {
    ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1
}

if ! command -v pg_createcluster >/dev/null 2>&1 || [ -z "$(installed_version)" ] \
    || [ ! -x "/usr/lib/postgresql/$(installed_version)/bin/postgres" ]; then
    log "installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y postgresql >&2
fi
VERSION="$(installed_version)"
if [ -z "$VERSION" ]; then
    log "no PostgreSQL server under /usr/lib/postgresql after installing"
    exit 1
fi

cluster_field() { # $1: column of pg_lsclusters (1 version, 2 name, 3 port, 4 status)
    pg_lsclusters -h 2>/dev/null | awk -v v="$VERSION" -v c="$CLUSTER" -v f="$1" \
        '$1 == v && $2 == c { print $f }'
}

port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

free_port() {
    local taken port
    taken=" $(pg_lsclusters -h 2>/dev/null | awk '{ print $3 }' | tr '\n' ' ') "
    for port in $(seq 5433 5499); do
        case "$taken" in *" $port "*) continue ;; esac
        if ! port_in_use "$port"; then
            echo "$port"
            return 0
        fi
    done
    return 1
}

if [ -z "$(cluster_field 2)" ]; then
    PORT="$(free_port)" || { log "no free port in 5433-5499"; exit 1; }
    log "creating cluster $VERSION/$CLUSTER on port $PORT"
    pg_createcluster --encoding=UTF8 --locale=C.UTF-8 --port="$PORT" "$VERSION" "$CLUSTER" >&2
fi
PORT="$(cluster_field 3)"

if [ "$(cluster_field 4)" != "online" ]; then
    if port_in_use "$PORT"; then
        log "port $PORT of cluster $VERSION/$CLUSTER is taken by another process"
        exit 1
    fi
    log "starting cluster $VERSION/$CLUSTER"
    pg_ctlcluster "$VERSION" "$CLUSTER" start >&2
fi
for _ in $(seq 1 60); do
    if pg_isready -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then break; fi
    sleep 0.5
done
if ! pg_isready -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
    log "cluster $VERSION/$CLUSTER does not accept connections on 127.0.0.1:$PORT"
    exit 1
fi

psql_admin() {
    runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" -d postgres "$@"
}
# The role may create databases: each test makes its own and drops it. It may create
# roles: the scratchpad's `query_data` runs caller-written SQL as a NOLOGIN role of
# its own (`<role>_query`) that can read only the session's tables, and the role
# that runs loadout creates that role the first time it is needed.
psql_admin -v role="$ROLE" -v password="$PASSWORD" >&2 <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', :'role')
    WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I LOGIN CREATEDB CREATEROLE PASSWORD %L', :'role', :'password') \gexec
SQL
psql_admin -v role="$ROLE" -v db="$DATABASE" >&2 <<'SQL'
SELECT format('CREATE DATABASE %I OWNER %I ENCODING %L TEMPLATE template0', :'db', :'role', 'UTF8')
    WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \gexec
SQL

log "PostgreSQL $VERSION cluster $CLUSTER ready on 127.0.0.1:$PORT"
echo "export LOADOUT_TEST_POSTGRES_URL='postgres://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DATABASE'"
echo "export LOADOUT_TEST_PG_STOP_CMD='pg_ctlcluster $VERSION $CLUSTER stop -m fast'"
echo "export LOADOUT_TEST_PG_START_CMD='pg_ctlcluster $VERSION $CLUSTER start'"
