#!/usr/bin/env bash
# The date matrix: the tests whose outcome depends on the calendar (time
# partitions, the purge's cutoff, event times, month and year ends, a DST
# change, 29 February), run at fixed dates and in fixed zones, so that a
# test that holds only on some days of a month fails on every day.
#
#   internal/testing/dates/run.sh        (test.sh runs it as a step)
#
# For each case it starts a throwaway PostgreSQL and MariaDB whose clocks
# libfaketime (Debian package libfaketime) shifts to the case's date, and
# runs the tests against them built with the tag inbox_fakeclock, which
# shifts the library's and the tests' clock by the same offset
# (internal/clock), with TZ set to the case's zone for the test process and
# the servers. SQLite and PgBouncer tests are left out: SQLite's clock is
# the test process's own, which libfaketime cannot shift, and no PgBouncer
# runs in front of these servers.
set -euo pipefail
cd "$(dirname "$0")/../../.."

log() { printf 'dates: %s\n' "$*" >&2; }

# date (UTC) and zone: a month's last day, a month's first day at -12:00,
# 31 December at +14:00, a quarter of an hour before New York's clocks go
# forward (07:00 UTC), 29 February at +14:00.
cases=(
	"2027-01-31T23:20:00Z UTC"
	"2027-02-01T00:05:00Z Etc/GMT+12"
	"2026-12-31T23:20:00Z Pacific/Kiritimati"
	"2027-03-14T06:45:00Z America/New_York"
	"2028-02-29T23:20:00Z Etc/GMT-14"
)
# The time-sensitive tests of the library's module, and what they must not
# run here: PostgreSQL's lock and statement timeouts never fire under
# libfaketime (its signal handler reads the real clock), so tests of
# timeouts run in the main suite only.
run='Partition|EventIDTime|OddSession|Purge|Stale|EventTime|TimeInEventID|Monthly|MoveBlocked|ExpiredRows|RecentDuplicates|ConsumerRetention|ClaimTimes|TimestampColumn|TimestampWithoutTimeZone|TimeColumns|CreateSchemaRaces|^TestRun$'
skip='SQLite|Pooler|Pooling|Timeout'
packages=(. ./sqlinbox ./pgxinbox ./purge)
# The inbox command's, whose tests run each database as a subtest.
cmd_run='Stats|Check|Forget|PurgeDryRun|PurgeConsumerRetention|PurgePartitioned|PurgeLoop'
cmd_skip='/SQLite'

faketime=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n 1 || true)
if [ -z "$faketime" ]; then
	log "libfaketime is missing: install the Debian package libfaketime (./test.sh --install does)"
	exit 1
fi
pg=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$pg" ] || ! command -v mariadbd >/dev/null 2>&1; then
	log "PostgreSQL's and MariaDB's server binaries are needed (Debian packages postgresql and mariadb-server; ./test.sh installs them)"
	exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/inbox-dates.XXXXXX")
chmod 755 "$work"
owner=$(id -un)
if [ "$(id -u)" = 0 ]; then owner=postgres; fi
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u "$owner" -- "$@"; else "$@"; fi; }
mariadb_pid=
stop_servers() {
	as_owner "$pg/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1 || true
	if [ -n "$mariadb_pid" ]; then
		kill "$mariadb_pid" 2>/dev/null || true
		wait "$mariadb_pid" 2>/dev/null || true
		mariadb_pid=
	fi
}
trap 'stop_servers; rm -rf "$work"' EXIT

answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
	local p=$1
	while answers "$p"; do p=$((p + 1)); done
	echo "$p"
}
chown "$owner" "$work" 2>/dev/null || true
as_owner "$pg/initdb" -D "$work/pg" -U postgres --auth=trust -E UTF8 --no-locale -N >"$work/initdb.log"
mariadb-install-db --no-defaults --user="$(id -un)" --datadir="$work/mariadb" --auth-root-authentication-method=normal --skip-test-db >"$work/install.log" 2>&1
pg_port=$(free_port 27431)
my_port=$(free_port $((pg_port + 1)))

# start_servers OFFSET ZONE starts both servers with their clocks OFFSET
# seconds ahead, in ZONE.
start_servers() {
	local env=(env LD_PRELOAD="$faketime" FAKETIME="$(printf %+d "$1")" DONT_FAKE_MONOTONIC=1 FAKETIME_DONT_RESET=1 TZ="$2")
	as_owner "${env[@]}" "$pg/pg_ctl" -D "$work/pg" -l "$work/pg.log" -w \
		-o "-c listen_addresses=127.0.0.1 -p $pg_port -k $work -c fsync=off -c max_connections=200 -c timezone=$2" start >/dev/null
	"$pg/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -qc 'SET client_min_messages = warning' -c 'DROP DATABASE IF EXISTS test' -c 'CREATE DATABASE test' >/dev/null
	"${env[@]}" mariadbd --no-defaults --user="$(id -un)" --datadir="$work/mariadb" --socket="$work/mariadb.sock" --port="$my_port" \
		--bind-address=127.0.0.1 --skip-name-resolve --innodb-flush-log-at-trx-commit=2 --max-connections=300 >"$work/mariadb.log" 2>&1 &
	mariadb_pid=$!
	for _ in $(seq 1 150); do
		if mariadb --no-defaults -uroot --socket="$work/mariadb.sock" -e 'SELECT 1' >/dev/null 2>&1; then break; fi
		sleep 0.2
	done
	mariadb --no-defaults -uroot --socket="$work/mariadb.sock" -e "DROP DATABASE IF EXISTS test; CREATE DATABASE test;
		CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
}

status=0
for c in "${cases[@]}"; do
	read -r at zone <<<"$c"
	offset=$(($(date -d "$at" +%s) - $(date +%s)))
	start_servers "$offset" "$zone"
	got=$("$pg/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -d test -Atc "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI')")
	log "$at in $zone: the servers' clock reads $got UTC"
	export TZ="$zone" INBOX_TEST_CLOCK_OFFSET="$offset" \
		INBOX_TEST_POSTGRES_DSN="postgres://postgres@127.0.0.1:$pg_port/test?sslmode=disable" \
		INBOX_TEST_MYSQL_DSN="root@tcp(127.0.0.1:$my_port)/test"
	if ! go test -tags inbox_fakeclock -race -count=1 -timeout 5m -run "$run" -skip "$skip" "${packages[@]}" ||
		! go test -tags inbox_fakeclock -race -count=1 -timeout 5m -run "$cmd_run" -skip "$cmd_skip" ./cmd/inbox; then
		log "FAILED at $at in $zone"
		status=1
	fi
	unset TZ
	stop_servers
done
exit "$status"
