#!/usr/bin/env bash
# The whole test suite, against real databases and brokers:  ./test.sh [go test flags] [packages]
#
# PostgreSQL, MariaDB, RabbitMQ, NATS (with JetStream) and Redis are used where
# they already answer (the addresses below, or INBOX_TEST_POSTGRES_DSN,
# INBOX_TEST_MYSQL_DSN, INBOX_TEST_AMQP_URL, INBOX_TEST_NATS_URL,
# INBOX_TEST_REDIS_ADDR). Otherwise throwaway servers are started in a
# temporary directory and removed at exit; as root, the Debian packages are
# installed first when their binaries are missing.
# PgBouncer is always started, in transaction pooling mode in front of
# that PostgreSQL (INBOX_TEST_PGBOUNCER_DSN points at another).
# INBOX_TEST_THROWAWAY=1 forces throwaway servers even when local ones answer.
# ./test.sh --install only installs the missing packages (CI does it before it
# cuts the network off).
# ./test.sh --lint only runs the linter, staticcheck, on every module, and
# starts no server (the whole suite runs it first).
#
# The repository holds several Go modules (the library, and the test rig and
# examples that need heavy dependencies); every one is vetted, linted and tested.
set -euo pipefail
cd "$(dirname "$0")"

log() { printf 'test.sh: %s\n' "$*" >&2; }
# why_install says why the tests need Debian package $1 (a server's, whose
# address variable is $2).
why_install() {
	case $1 in
	prometheus) echo "its promtool checks and unit-tests the alerting rules (its server is not started)" ;;
	galera-4) echo "the Galera tests start a three-node MariaDB Galera cluster of their own with it" ;;
	rsync) echo "a Galera node that joins its cluster copies the data with it" ;;
	libfaketime) echo "the date matrix (internal/testing/dates) runs the time-sensitive tests against servers whose clock it sets to chosen dates" ;;
	*) echo "the tests start a throwaway server from it where none answers${2:+ (at \$$2, or on its usual local port)}" ;;
	esac
}
apt_install() { # apt_install PACKAGE [VARIABLE] [apt-get flags...]
	if [ "$(id -u)" != 0 ]; then
		log "$1 is not installed and this is not root: install the Debian package $1${2:+, or point $2 at a server}"
		exit 1
	fi
	log "installing the Debian package $1 with apt-get (update, then install): $(why_install "$1" "${2:-}")"
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${@:3}" "$1" >/dev/null
}
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true; }
# The Debian packages put these outside a user's PATH.
rabbitmq_bin=/usr/lib/rabbitmq/bin/rabbitmq-server
has() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
# apt_install_stopped PACKAGE [VARIABLE] [apt-get flags...] installs a
# package whose service must not run: a policy-rc.d refuses to start it while
# dpkg runs (unless the machine has its own, whose policy may allow it: then
# it is stopped), and it is disabled at boot.
apt_install_stopped() {
	local policy=/usr/sbin/policy-rc.d service=${SERVICE:-$1}
	if [ "$(id -u)" = 0 ] && [ ! -e "$policy" ]; then
		(
			trap 'rm -f "$policy"' EXIT
			printf '#!/bin/sh\nexit 101\n' >"$policy"
			chmod 755 "$policy"
			apt_install "$@"
		)
	else
		apt_install "$@"
	fi
	invoke-rc.d "$service" stop >/dev/null 2>&1 || true
	update-rc.d "$service" disable >/dev/null 2>&1 || true
	deb-systemd-helper disable "$service.service" >/dev/null 2>&1 || true
}
# install_promtool installs Debian's prometheus package for promtool, which
# checks and unit-tests prommetrics' alerting rules. Only the binary is
# wanted: the package's Prometheus server (on :9090) must not run; the
# recommended node exporter is left out.
install_promtool() {
	command -v promtool >/dev/null 2>&1 && return
	apt_install_stopped prometheus "" --no-install-recommends
}
# install_patroni installs Patroni and etcd for the failover tests, which
# start their own cluster; the packages' services must not run.
install_patroni() {
	has patroni || SERVICE=patroni apt_install_stopped patroni
	# Patroni's etcd client, for Debian's Python (not whichever python3 is first in PATH).
	/usr/bin/python3 -c 'import etcd' 2>/dev/null || apt_install python3-etcd
	has etcd || SERVICE=etcd apt_install_stopped etcd-server
}
# install_galera installs Galera for the multi-primary tests, which start
# their own MariaDB cluster, and rsync, with which a joining node copies a
# donor's data.
install_galera() {
	[ -e /usr/lib/galera/libgalera_smm.so ] || apt_install galera-4
	has rsync || apt_install rsync
}
# install_dates installs what the date matrix (internal/testing/dates)
# runs: libfaketime, and the PostgreSQL and MariaDB servers it starts at
# chosen dates, even where servers already answer on the usual ports.
install_dates() {
	ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || apt_install libfaketime
	[ -n "$(pg_bin)" ] || apt_install postgresql INBOX_TEST_POSTGRES_DSN
	has mariadbd || apt_install mariadb-server INBOX_TEST_MYSQL_DSN
}
# install_missing installs the Debian package of every server binary that is
# missing, and promtool.
install_missing() {
	[ -n "$(pg_bin)" ] || apt_install postgresql INBOX_TEST_POSTGRES_DSN
	has pgbouncer || apt_install pgbouncer INBOX_TEST_PGBOUNCER_DSN
	has mariadbd || apt_install mariadb-server INBOX_TEST_MYSQL_DSN
	[ -x "$rabbitmq_bin" ] || apt_install rabbitmq-server INBOX_TEST_AMQP_URL
	has nats-server || apt_install nats-server INBOX_TEST_NATS_URL
	has redis-server || apt_install redis-server INBOX_TEST_REDIS_ADDR
	install_patroni
	install_galera
	install_dates
	install_promtool
}
if [ "${1:-}" = --install ]; then
	install_missing
	exit 0
fi
# promtool, for the alerting rules' tests, Patroni with etcd, for the
# failover tests, Galera, for the multi-primary tests, and libfaketime, for
# the date matrix: installed here
# when missing, as the servers below; without root, the tests say how to get
# them.
[ "$(id -u)" != 0 ] || [ "${1:-}" = --lint ] || { install_promtool; install_patroni; install_galera; install_dates; }

work=$(mktemp -d "${TMPDIR:-/tmp}/inbox-test.XXXXXX")
chmod 755 "$work"
# What stops each throwaway server: commands in $stops, and lines of
# $work/stops written by starters that run in the background.
stops=()
background=()
# Tests that kill database servers start their own under $work/servers
# (internal/testing/dbserver), each recording its processes in a file pids.
# A test binary that died (a timeout) ran no cleanup: what it left running is
# killed at exit, Patroni before the PostgreSQL it would restart, each
# process checked by its command line to still be one the tests started.
export INBOX_TEST_SERVERS_DIR=$work/servers
kill_leftovers() {
	local dir pid
	for dir in "$work"/servers/*/; do
		[ -d "$dir" ] || continue
		for pid in $(cat "$dir/pids" 2>/dev/null) $(find "$dir" -name postmaster.pid -exec head -n 1 {} \; 2>/dev/null); do
			if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$dir"; then kill -9 "$pid" 2>/dev/null || true; fi
		done
	done
}
cleanup() {
	if [ -s "$work/pgbouncer/exits" ]; then
		log "PgBouncer exited $(wc -l <"$work/pgbouncer/exits") times during the run and was started again (PgBouncer 1.18 crashes on some cancel requests: its issues 801, 822, 904): a test that failed meanwhile may have failed for it; the end of its log:"
		tail -n 20 "$work/pgbouncer/log" >&2 || true
	fi
	kill_leftovers
	for pid in "${background[@]}"; do kill "$pid" 2>/dev/null || true; done
	for cmd in "${stops[@]}"; do eval "$cmd" >/dev/null 2>&1 || true; done
	if [ -f "$work/stops" ]; then
		while read -r cmd; do eval "$cmd" >/dev/null 2>&1 || true; done <"$work/stops"
	fi
	rm -rf "$work"
}
trap cleanup EXIT

now_ms() { echo $(($(date +%s%N) / 1000000)); }
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
start_postgres() {
	local bin
	bin=$(pg_bin)
	if [ -z "$bin" ]; then
		apt_install postgresql INBOX_TEST_POSTGRES_DSN
		bin=$(pg_bin)
	fi
	local dir=$work/postgres port=25431 owner=postgres started= t0
	t0=$(now_ms)
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
	log "started a throwaway PostgreSQL on 127.0.0.1:$port in $(($(now_ms) - t0)) ms"
}

# start_pgbouncer starts PgBouncer in transaction pooling mode in front of
# the PostgreSQL of INBOX_TEST_POSTGRES_DSN (a postgres:// URL), the way
# production services reach PostgreSQL: no machine runs one for the tests.
# server_round_robin hands consecutive transactions of one client to
# different server connections of a warm pool, which is what breaks
# session state. It runs as the postgres user (it refuses root), under
# $dir/run.sh, which starts it again should it exit: PgBouncer 1.18 can
# crash on a cancel request (its issues 801, 822 and 904, fixed by 1.20.1),
# and Go drivers send one for a statement whose context ends. The run then
# says so at its end.
start_pgbouncer() {
	has pgbouncer || apt_install pgbouncer INBOX_TEST_PGBOUNCER_DSN
	local bin dir=$work/pgbouncer port=26431 owner=postgres hostport t0 up= supervisor
	bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
	t0=$(now_ms)
	hostport=${INBOX_TEST_POSTGRES_DSN#postgres://*@}
	hostport=${hostport%%/*}
	case "$hostport" in
	*:*) ;;
	*)
		log "cannot put PgBouncer in front of INBOX_TEST_POSTGRES_DSN (not a postgres://user@host:port/... URL): set INBOX_TEST_PGBOUNCER_DSN"
		exit 1
		;;
	esac
	mkdir -p "$dir"
	echo '"postgres" ""' >"$dir/users"
	cat >"$dir/run.sh" <<-EOF
		ulimit -n 4096 2>/dev/null
		for _ in \$(seq 1 20); do
			[ ! -e "$dir/stop" ] && [ -e "$dir/pgbouncer.ini" ] || exit 0
			"$bin" -q "$dir/pgbouncer.ini" 2>>"$dir/start.log"
			[ ! -e "$dir/stop" ] && [ -e "$dir/pgbouncer.ini" ] || exit 0
			date >>"$dir/exits"
			sleep 0.2
		done
	EOF
	if [ "$(id -u)" = 0 ]; then chown -R postgres "$dir"; else owner=$(id -un); fi
	for _ in 1 2 3 4 5; do # another program may take the port first
		port=$(free_port $((port + 1)))
		cat >"$dir/pgbouncer.ini" <<-EOF
			[databases]
			test = host=${hostport%:*} port=${hostport##*:} dbname=test user=postgres
			[pgbouncer]
			listen_addr = 127.0.0.1
			listen_port = $port
			unix_socket_dir =
			auth_type = trust
			auth_file = $dir/users
			pool_mode = transaction
			server_round_robin = 1
			default_pool_size = 20
			max_client_conn = 2000
			logfile = $dir/log
			pidfile = $dir/pid
		EOF
		rm -f "$dir/stop" "$dir/exits"
		as_owner "$owner" sh "$dir/run.sh" >/dev/null 2>&1 &
		supervisor=$!
		for _ in $(seq 1 100); do
			if answers 127.0.0.1 "$port"; then up=1; break; fi
			sleep 0.05
		done
		[ -z "$up" ] || break
		touch "$dir/stop"
		[ ! -f "$dir/pid" ] || kill "$(cat "$dir/pid")" 2>/dev/null || true
		wait "$supervisor" 2>/dev/null || true
	done
	if [ -z "$up" ]; then
		log "could not start PgBouncer; its log:"
		cat "$dir/start.log" "$dir/log" >&2 2>/dev/null || true
		exit 1
	fi
	rm -f "$dir/exits"
	# The supervisor must see the stop file before cleanup removes it.
	stops+=("touch $dir/stop; kill \$(cat $dir/pid); wait $supervisor")
	export INBOX_TEST_PGBOUNCER_DSN="postgres://postgres@127.0.0.1:$port/test?sslmode=disable"
	log "started $("$bin" --version | head -n 1) in transaction pooling mode on 127.0.0.1:$port in $(($(now_ms) - t0)) ms"
}

start_mariadb() {
	if ! command -v mariadbd >/dev/null 2>&1; then
		apt_install mariadb-server INBOX_TEST_MYSQL_DSN
	fi
	local dir=$work/mariadb port=23305 user pid up= t0
	t0=$(now_ms)
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
	log "started a throwaway MariaDB on 127.0.0.1:$port in $(($(now_ms) - t0)) ms"
}

# launch NAME BASE RUN starts a server in the background ("RUN port", which
# execs it, logging to $work/NAME/log) on a free port above BASE, waits until
# it answers there, and starts over on another port when it exits first
# (another program took the port). It sets port and pid.
launch() {
	local name=$1 base=$2 run=$3 dir=$work/$1
	mkdir -p "$dir"
	port=$base
	for _ in 1 2 3 4 5; do
		port=$(free_port $((port + 1)))
		"$run" "$port" >"$dir/log" 2>&1 &
		pid=$!
		echo "kill $pid" >>"$work/stops"
		for _ in $(seq 1 600); do
			if ! kill -0 "$pid" 2>/dev/null; then break; fi
			if answers 127.0.0.1 "$port"; then return 0; fi
			sleep 0.05
		done
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	log "could not start $name; its log:"
	cat "$dir/log" >&2
	return 1
}

# RabbitMQ gets a node of its own: its own node name, Erlang cookie (in
# HOME), port mapper (epmd) and distribution ports, and no system-wide
# configuration, so that a RabbitMQ already running on the machine is left
# alone. Its start script stops the Erlang VM on SIGTERM.
run_rabbitmq() {
	local dir=$work/rabbitmq epmd dist
	dist=$(free_port $(($1 + 100)))
	epmd=$(free_port $(($1 + 200)))
	epmd -address 127.0.0.1 -port "$epmd" &
	echo "kill $!" >>"$work/stops"
	printf 'listeners.tcp.1 = 127.0.0.1:%s\n' "$1" >"$dir/rabbitmq.conf"
	: >"$dir/rabbitmq-env.conf"
	echo '[].' >"$dir/enabled_plugins"
	HOME=$dir RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf \
		RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
		RABBITMQ_NODENAME=inbox-test-$$@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$1 \
		RABBITMQ_DIST_PORT=$dist ERL_EPMD_PORT=$epmd ERL_EPMD_ADDRESS=127.0.0.1 \
		RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log.d RABBITMQ_PLUGINS_EXPAND_DIR=$dir/plugins \
		RABBITMQ_FEATURE_FLAGS_FILE=$dir/feature_flags \
		exec "$rabbitmq_bin"
}
# RabbitMQ takes seconds to boot, so it boots in the background while the
# rest goes on; await_rabbitmq waits for it before the tests that need it.
start_rabbitmq() {
	[ -x "$rabbitmq_bin" ] || apt_install rabbitmq-server INBOX_TEST_AMQP_URL
	mkdir -p "$work/rabbitmq"
	(
		t0=$(now_ms)
		launch rabbitmq 25671 run_rabbitmq || exit 1
		echo "amqp://guest:guest@127.0.0.1:$port/" >"$work/rabbitmq/url"
		echo $(($(now_ms) - t0)) >"$work/rabbitmq/took"
	) &
	rabbitmq_starter=$!
	background+=("$rabbitmq_starter")
	export INBOX_TEST_AMQP_URL=pending
}
await_rabbitmq() {
	[ "${INBOX_TEST_AMQP_URL:-}" = pending ] || return 0
	local t0 url
	t0=$(now_ms)
	wait "$rabbitmq_starter" || exit 1
	INBOX_TEST_AMQP_URL=$(cat "$work/rabbitmq/url")
	url=${INBOX_TEST_AMQP_URL#amqp://guest:guest@}
	log "started a throwaway RabbitMQ on ${url%/} in $(cat "$work/rabbitmq/took") ms, in the background (the tests waited $(($(now_ms) - t0)) ms for it)"
}

# The Vitess tests (internal/testing/vitess) start a vttestserver of their
# own, whose binaries build from the release internal/testing/vitess/tools
# pins. Go's build cache keeps them: the first build on a machine compiles
# for minutes, which would count against the test binary's timeout, later
# ones take seconds. start_vitess_build builds them in the background;
# await_vitess waits for it before the tests that need them.
vitess_tools=internal/testing/vitess/tools
start_vitess_build() {
	(
		t0=$(now_ms)
		for tool in vttestserver vtcombo mysqlctl; do
			go -C "$vitess_tools" tool -n "$tool" >/dev/null || exit 1
		done
		echo $(($(now_ms) - t0)) >"$work/vitess-build-took"
	) >"$work/vitess-build.log" 2>&1 &
	vitess_builder=$!
	background+=("$vitess_builder")
}
await_vitess() {
	[ -n "${vitess_builder:-}" ] || return 0
	local t0 status=0
	t0=$(now_ms)
	wait "$vitess_builder" || status=$?
	vitess_builder=
	if [ "$status" != 0 ]; then
		log "building Vitess failed (the Vitess tests will say why again):"
		cat "$work/vitess-build.log" >&2
		return 0
	fi
	log "built Vitess (vttestserver, vtcombo, mysqlctl) in $(cat "$work/vitess-build-took") ms, in the background (the tests waited $(($(now_ms) - t0)) ms for it)"
}
# wants_vitess reports whether the package patterns $@ include the Vitess tests.
wants_vitess() {
	local p
	for p in "$@"; do
		case "${p%/}" in ./internal/testing/vitess | ./internal/testing/...) return 0 ;; esac
	done
	return 1
}

# start_server NAME PACKAGE VAR BASE SCHEME LABEL starts the throwaway server
# run_NAME (from Debian package PACKAGE, binary of the same name) and exports
# VAR=SCHEME127.0.0.1:port.
start_server() {
	local t0
	has "$2" || apt_install "$2" "$3"
	t0=$(now_ms)
	launch "$1" "$4" "run_$1" || exit 1
	export "$3=$5127.0.0.1:$port"
	log "started a throwaway $6 on 127.0.0.1:$port in $(($(now_ms) - t0)) ms"
}
run_nats() { exec nats-server -a 127.0.0.1 -p "$1" -js -sd "$work/nats/jetstream"; }
start_nats() { start_server nats nats-server INBOX_TEST_NATS_URL 24221 nats:// "NATS with JetStream"; }
run_redis() { exec redis-server --bind 127.0.0.1 --port "$1" --save '' --appendonly no --dir "$work/redis"; }
start_redis() { start_server redis redis-server INBOX_TEST_REDIS_ADDR 26378 "" Redis; }

# use_or_start VAR VALUE PORT START exports VAR=VALUE when something answers
# on PORT (and no throwaway is asked for), else runs START; a VAR already set
# wins.
use_or_start() {
	[ -z "${!1:-}" ] || return 0
	if [ "${INBOX_TEST_THROWAWAY:-}" != 1 ] && answers 127.0.0.1 "$3"; then
		export "$1=$2"
	else
		"$4"
	fi
}
# min_go prints the Go version the library's go.mod requires.
min_go() { awk '$1 == "go" { print $2; exit }' go.mod; }
# oldest_go runs the go command of the toolchain go.mod names. Once that
# toolchain is in the module cache it runs it from there: switching with
# GOTOOLCHAIN re-checks the toolchain against the checksum database, which
# needs the network whenever another download has moved the database's tree
# since (a CI run with the network cut off).
oldest_go() {
	local bin
	bin="$(go env GOMODCACHE)/golang.org/toolchain@v0.0.1-go$(min_go).$(go env GOOS)-$(go env GOARCH)/bin/go"
	if [ -x "$bin" ]; then
		GOTOOLCHAIN=local "$bin" "$@"
	else
		GOTOOLCHAIN=go$(min_go) go "$@"
	fi
}

# Every module of the repository, the library's first.
modules=(.)
# internal/tools and internal/testing/vitess/tools are not: they hold no
# package, only the pins of the linter (below) and of Vitess (which the
# Vitess tests build).
tools=internal/tools
pins=("$tools" internal/testing/vitess/tools)
while read -r mod; do
	case " ${pins[*]} " in *" $(dirname "${mod#./}") "*) continue ;; esac
	modules+=("$(dirname "$mod")")
done < <(find . -mindepth 2 -name go.mod -not -path './.git/*' | sort)
# module_of prints the module directory that holds package path $1.
module_of() {
	local best=. m
	for m in "${modules[@]}"; do
		case "${1#./}/" in "${m#./}"/*) [ ${#m} -gt ${#best} ] && best=$m ;; esac
	done
	echo "$best"
}
# in_module runs "go $1 <package $2> args..." from the module that holds the package.
in_module() {
	local verb=$1 pkg=$2 m rel
	shift 2
	m=$(module_of "$pkg")
	rel=./$(realpath -m --relative-to="$m" "$pkg")
	(cd "$m" && go "$verb" "$rel" "$@")
}

# step NAME COMMAND... runs one step of the suite. A step that fails does
# not stop the others: its name, with the failing tests and packages and the
# linter's findings of its output, is kept for the summary, and test.sh exits
# 1 at the end.
failed=()
steps=0
step() {
	local name=$1 out=$work/step.log status=0
	shift
	steps=$((steps + 1))
	"$@" 2>&1 | tee "$out" || status=$?
	if [ "$status" != 0 ]; then
		failed+=("$name (exit status $status)")
		while read -r line; do failed+=("    $line"); done < <(grep -E '^(--- FAIL|FAIL[[:space:]]|panic:|WARNING: DATA RACE)|\((SA|S|ST|QF|U)[0-9]{4}\)$' "$out" | sort -u)
		log "FAILED: $name; going on with the other steps"
	fi
}
in_dir() { (cd "$1" && shift && "$@"); }
quiet() { "$@" >/dev/null; } # an example's output is long; its errors go to stderr

# summary reports every failed step and exits 1 if there is one.
summary() {
	if [ ${#failed[@]} -eq 0 ]; then
		log "all $steps steps passed"
		exit 0
	fi
	log "failed steps, of $steps:"
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
}

# packages_of prints the package patterns of module $1: ./..., which skips
# directories starting with "_", and the examples of _examples/ it holds.
packages_of() {
	local d
	echo ./...
	for d in _examples/*/; do
		if [ "$(module_of "./$d")" = "$1" ]; then echo "./$(realpath -m --relative-to="$1" "$d")"; fi
	done
}
# lint_all builds staticcheck (the version $tools/go.mod pins, a module of its
# own so that the library's users never inherit its dependencies) once into
# $work, and runs it on every module, each a step. Its checks and their
# deliberate exceptions are in staticcheck.conf.
lint_all() {
	local m pkgs
	step "build staticcheck" go -C "$tools" build -o "$work/bin/staticcheck" honnef.co/go/tools/cmd/staticcheck
	for m in "${modules[@]}"; do
		mapfile -t pkgs < <(packages_of "$m")
		step "staticcheck in module $m" lint "$m" "${pkgs[@]}"
	done
}
lint() { # lint MODULE PACKAGES...
	if [ ! -x "$work/bin/staticcheck" ]; then
		echo "staticcheck was not built: see the step that builds it"
		return 1
	fi
	in_dir "$1" "$work/bin/staticcheck" "${@:2}"
}
# ./test.sh --lint only lints, with no server.
if [ "${1:-}" = --lint ]; then
	lint_all
	summary
fi

# RabbitMQ first: it boots while the others start.
use_or_start INBOX_TEST_AMQP_URL amqp://guest:guest@127.0.0.1:5672/ 5672 start_rabbitmq
use_or_start INBOX_TEST_NATS_URL nats://127.0.0.1:4222 4222 start_nats
use_or_start INBOX_TEST_REDIS_ADDR 127.0.0.1:6379 6379 start_redis

if [ -z "${INBOX_TEST_POSTGRES_DSN:-}" ]; then
	if [ "${INBOX_TEST_THROWAWAY:-}" != 1 ] && answers 127.0.0.1 5432; then
		export INBOX_TEST_POSTGRES_DSN="postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	else
		start_postgres
	fi
fi
[ -n "${INBOX_TEST_PGBOUNCER_DSN:-}" ] || start_pgbouncer
if [ -z "${INBOX_TEST_MYSQL_DSN:-}" ]; then
	if [ "${INBOX_TEST_THROWAWAY:-}" != 1 ] && answers 127.0.0.1 3306; then
		export INBOX_TEST_MYSQL_DSN="root@tcp(127.0.0.1:3306)/test"
	else
		start_mariadb
	fi
fi

if [ $# -eq 0 ]; then
	start_vitess_build
	# Lint first: RabbitMQ boots and Vitess builds meanwhile.
	lint_all
	for m in "${modules[@]}"; do
		# The library's own tests need no broker: RabbitMQ boots meanwhile.
		[ "$m" = . ] || await_rabbitmq
		[ "$m" != ./internal/testing ] || await_vitess
		mapfile -t pkgs < <(packages_of "$m")
		step "go vet in module $m" in_dir "$m" go vet "${pkgs[@]}"
		step "go test in module $m" in_dir "$m" go test -race -count=1 ./...
	done
	# The time-sensitive tests again, at fixed dates and zones (a month's
	# last and first day, 31 December, a DST change, 29 February).
	step "the date matrix" internal/testing/dates/run.sh
	# The README's first command: it must keep working with no server at all.
	step "example quickstart" quiet in_module run ./_examples/quickstart
	# The PostgreSQL example, twice at once: each run has tables of its own.
	step "example postgres" in_module test ./_examples/postgres -race -count=1
	# The metrics example checks its own /metrics page and fails without the counters.
	step "example metrics" quiet in_module run ./_examples/metrics -addr 127.0.0.1:0
	# NATS JetStream embedded in the process, redelivering three ways; it fails unless every order has one invoice.
	step "example nats-jetstream" quiet in_module run ./_examples/nats-jetstream
	# The complete loop on embedded Kafka; it fails unless every order has one invoice and one notification.
	step "example outbox-kafka-inbox" quiet in_module run ./_examples/outbox-kafka-inbox -dsn "$INBOX_TEST_POSTGRES_DSN"
	step "example outbox-kafka-inbox on MariaDB" quiet in_module run ./_examples/outbox-kafka-inbox -dsn "$INBOX_TEST_MYSQL_DSN"
	# Watermill's exactly-once-delivery-counter behind the inbox; it fails unless the counter equals the events.
	step "example exactly-once-counter" quiet in_module run ./_examples/exactly-once-counter -dsn "$INBOX_TEST_POSTGRES_DSN"
	# Invoice emails through a River job and a sweeper; it fails unless every order has one invoice and an email, and
	# (with -kill, its senders SIGKILLed after the mail server accepted an email) every duplicate email is explained.
	step "example invoicing" quiet in_module run ./_examples/invoicing
	step "example invoicing -kill" quiet in_module run ./_examples/invoicing -kill
	step "example invoicing on PostgreSQL" quiet in_module run ./_examples/invoicing -dsn "$INBOX_TEST_POSTGRES_DSN"
	# The library promises the Go version its go.mod names: its own tests pass
	# with that toolchain (the module proxy serves it; CI fetches it first).
	step "go test with go$(min_go)" oldest_go test -count=1 ./...
	summary
fi

# With arguments: go test flags and packages; each package is tested in its own module.
flags=() pkgs=()
for a in "$@"; do
	case "$a" in ./* | .) pkgs+=("$a") ;; *) flags+=("$a") ;; esac
done
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)
if wants_vitess "${pkgs[@]}"; then
	start_vitess_build
	await_vitess
fi
await_rabbitmq
for p in "${pkgs[@]}"; do
	step "go test $p" in_module test "$p" -race -count=1 "${flags[@]}"
done
summary
