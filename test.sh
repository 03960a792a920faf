#!/usr/bin/env bash
# The whole test suite, against real databases:  ./test.sh [go test flags] [packages]
#
# PostgreSQL and MariaDB are used where they already answer (the DSNs below, or
# INBOX_TEST_POSTGRES_DSN / INBOX_TEST_MYSQL_DSN). Otherwise throwaway servers are
# started in a temporary directory and removed at exit; as root, the Debian
# packages are installed first when their binaries are missing.
# INBOX_TEST_THROWAWAY=1 forces throwaway servers even when local ones answer.
set -euo pipefail
cd "$(dirname "$0")"

work=$(mktemp -d "${TMPDIR:-/tmp}/inbox-test.XXXXXX")
chmod 755 "$work"
stops=()
cleanup() {
	for cmd in "${stops[@]}"; do eval "$cmd" >/dev/null 2>&1 || true; done
	rm -rf "$work"
}
trap cleanup EXIT

log() { printf 'test.sh: %s\n' "$*" >&2; }
answers() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
# Throwaway servers listen below the usual ephemeral range (32768-60999), where
# a closing client connection's local port cannot keep them from binding.
free_port() {
	local p=$1
	while answers 127.0.0.1 "$p"; do p=$((p + 1)); done
	echo "$p"
}
as_owner() { # run as $1 when we are root, else as ourselves
	local user=$1; shift
	if [ "$(id -u)" = 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}
apt_install() {
	if [ "$(id -u)" != 0 ]; then
		log "$1 is not installed and this is not root: install the Debian package $1, or point $2 at a server"
		exit 1
	fi
	log "installing $1"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

start_postgres() {
	local bin
	bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -z "$bin" ]; then
		apt_install postgresql INBOX_TEST_POSTGRES_DSN
		bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	fi
	local dir=$work/postgres port=25431 owner=postgres started=
	mkdir -p "$dir"
	if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; else owner=$(id -un); fi
	as_owner "$owner" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale -N >"$dir/initdb.log"
	for _ in 1 2 3 4 5; do # another program may take the port first
		port=$(free_port $((port + 1)))
		if as_owner "$owner" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=300" start >/dev/null 2>&1; then
			started=1
			break
		fi
	done
	if [ -z "$started" ]; then
		log "could not start PostgreSQL; its log:"
		cat "$dir/log" >&2
		exit 1
	fi
	stops+=("as_owner $owner $bin/pg_ctl -D $dir/data -m immediate stop")
	"$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc 'CREATE DATABASE test' >/dev/null
	export INBOX_TEST_POSTGRES_DSN="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
	log "started a throwaway PostgreSQL on 127.0.0.1:$port"
}

start_mariadb() {
	if ! command -v mariadbd >/dev/null 2>&1; then
		apt_install mariadb-server INBOX_TEST_MYSQL_DSN
	fi
	local dir=$work/mariadb port=23305 user pid up=
	user=$(id -un)
	mkdir -p "$dir"
	mariadb-install-db --no-defaults --user="$user" --datadir="$dir/data" --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1
	for _ in 1 2 3 4 5; do # another program may take the port first
		port=$(free_port $((port + 1)))
		mariadbd --no-defaults --user="$user" --datadir="$dir/data" --socket="$dir/sock" --port="$port" \
			--bind-address=127.0.0.1 --skip-name-resolve --innodb-flush-log-at-trx-commit=2 --max-connections=500 >"$dir/log" 2>&1 &
		pid=$!
		for _ in $(seq 1 100); do
			if ! kill -0 "$pid" 2>/dev/null; then break; fi # exited: the port was taken
			if mariadb --no-defaults -uroot --socket="$dir/sock" -e 'SELECT 1' >/dev/null 2>&1; then up=1; break; fi
			sleep 0.2
		done
		if [ -n "$up" ]; then break; fi
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [ -z "$up" ]; then
		log "could not start MariaDB; its log:"
		cat "$dir/log" >&2
		exit 1
	fi
	stops+=("kill $pid")
	mariadb --no-defaults -uroot --socket="$dir/sock" -e "CREATE DATABASE IF NOT EXISTS test;
		CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
	export INBOX_TEST_MYSQL_DSN="root@tcp(127.0.0.1:$port)/test"
	log "started a throwaway MariaDB on 127.0.0.1:$port"
}

if [ -z "${INBOX_TEST_POSTGRES_DSN:-}" ]; then
	if [ "${INBOX_TEST_THROWAWAY:-}" != 1 ] && answers 127.0.0.1 5432; then
		export INBOX_TEST_POSTGRES_DSN="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	else
		start_postgres
	fi
fi
if [ -z "${INBOX_TEST_MYSQL_DSN:-}" ]; then
	if [ "${INBOX_TEST_THROWAWAY:-}" != 1 ] && answers 127.0.0.1 3306; then
		export INBOX_TEST_MYSQL_DSN="root@tcp(127.0.0.1:3306)/test"
	else
		start_mariadb
	fi
fi

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(./...)
go vet ./... $(ls -d ./_examples/*/)
go test -race -count=1 "${args[@]}"
if [ $# -eq 0 ]; then
	# The README's first command: it must keep working with no server at all.
	go run ./_examples/quickstart >/dev/null
	# The metrics example checks its own /metrics page and fails without the counters.
	go run ./_examples/metrics -addr 127.0.0.1:0 >/dev/null
	# The complete loop on embedded Kafka; it fails unless every order has one invoice and one notification.
	go run ./_examples/outbox-kafka-inbox -dsn "$INBOX_TEST_POSTGRES_DSN" >/dev/null
fi
