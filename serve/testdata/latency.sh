#!/bin/sh
# latency.sh: the latency of unmodified Debian tools through softroce's ABI
# (two `softroce serve` daemons on loopback) against the Go API's own tools,
# measured side by side in one run, the paths alternating ROUNDS times.
#
#   serve/testdata/latency.sh                      # ib_write_lat vs softroce lat, ibv_rc_pingpong vs softroce pingpong
#   VARIANTS="old=/tmp/old/softroce:/tmp/old/lib new=./softroce:abi/build" serve/testdata/latency.sh
#
# Environment:
#   SOFTROCE   the softroce binary (default: softroce on PATH)
#   LIB        the directory of the ABI libibverbs.so.1 (default: `$SOFTROCE abi build`)
#   VARIANTS   space-separated NAME=BINARY:LIBDIR daemons to compare (default abi=$SOFTROCE:$LIB);
#              each runs in every round, so before/after figures come from one run
#   TESTS      "lat pingpong" (default), or any of lat, pingpong, bw (ib_write_bw -s 65536 vs
#              softroce bw -mtu 4096, N_BW iterations, default 20000; MB/s), readbw (ib_read_bw
#              -s 65536 vs softroce bw --test read)
#   ROUNDS     rounds (default 3); N iterations per tool (default 5000)
#   SIZE_LAT   ib_write_lat / softroce lat message size (default 2)
#   SIZE_PP    ibv_rc_pingpong / softroce pingpong message size (default 4096)
#   PP_ARGS    more ibv_rc_pingpong arguments (-e: sleep on completion channels)
#   PORT       first UDP port (default 4821); PORT+1 is the other daemon, PORT+10.. the Go tools
#   TCP        first TCP port of the out-of-band exchanges (default 18621)
#   PERF       when set, `perf record -g` of the first daemon for each ABI run, into $OUT
#   STRACE     when set, `strace -c -f` of the first daemon for each ABI run, into $OUT
#   STAT       when set, `perf stat` (context switches, CPU time) of both daemons for each ABI run,
#              into $OUT/NAME.ROUND/stat.txt: counts per iteration hold up under load where times do not
#   OUT        directory for logs and profiles (default: a temporary one, printed); each
#              ABI run leaves both daemons' `softroce status --json` in NAME.ROUND/status.{a,b}.json
#   TIMEOUT    seconds each tool may run (default 120)
#
# It prints one line per tool run and a summary of ranges per path. Not a
# test: the machine's load decides the figures, so compare only rows of one run.
set -eu

SOFTROCE=${SOFTROCE:-softroce}
ROUNDS=${ROUNDS:-3}
N=${N:-5000}
TESTS=${TESTS:-"lat pingpong"}
SIZE_LAT=${SIZE_LAT:-2}
SIZE_PP=${SIZE_PP:-4096}
PORT=${PORT:-4821}
TCP=${TCP:-18621}
OUT=${OUT:-$(mktemp -d /tmp/softroce-latency.XXXXXX)}
T="timeout ${TIMEOUT:-120}"
mkdir -p "$OUT"
if [ -z "${VARIANTS:-}" ]; then
	LIB=${LIB:-$("$SOFTROCE" abi build)}
	VARIANTS="abi=$SOFTROCE:$LIB"
fi
RES="$OUT/results"
: >"$RES"
echo "# logs in $OUT" >&2

pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

waitfile() { # path
	i=0
	while [ ! -S "$1" ]; do
		i=$((i + 1))
		[ $i -gt 200 ] && { echo "no socket $1" >&2; exit 1; }
		sleep 0.05
	done
}

waittcp() { # port
	i=0
	while ! ss -ltn "sport = :$1" | grep -q ":$1"; do
		i=$((i + 1))
		[ $i -gt 400 ] && { echo "nobody listens on TCP $1" >&2; exit 1; }
		sleep 0.05
	done
}

# perftest-style result row -> "typical avg p99"
latrow() { awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $5, $6, $8; exit }' "$1"; }
# perftest-style bandwidth row -> BW average (MB/s)
bwrow() { awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print $4; exit }' "$1"; }
# "... = X usec/iter" -> X
pprow() { awk '/usec\/iter/ { for (i = 1; i <= NF; i++) if ($i == "usec/iter") print $(i-1) }' "$1" | head -1; }

tcp=$TCP
nexttcp() { tcp=$((tcp + 1)); }

# abipair TAG TOOL ARGS...: TOOL ARGS as the server through daemon a and,
# once it listens on $tcp, as the client of 127.0.0.1 through daemon b,
# their output in $d/TAG.srv and $d/TAG.cli.
abipair() {
	tag=$1
	shift
	SOFTROCE_SOCKET="$d/a.sock" LD_LIBRARY_PATH="$lib" $T "$@" >"$d/$tag.srv" 2>&1 &
	s=$!
	waittcp "$tcp"
	SOFTROCE_SOCKET="$d/b.sock" LD_LIBRARY_PATH="$lib" $T "$@" 127.0.0.1 >"$d/$tag.cli" 2>&1 || true
	wait $s || echo "server exit $?" >>"$d/$t.srv.exit"
}

# abi NAME BIN LIB ROUND: both tools through two daemons of BIN.
abi() {
	name=$1 bin=$2 lib=$3 r=$4
	d="$OUT/$name.$r"
	mkdir -p "$d"
	"$bin" serve -q --addr 127.0.0.1 --socket "$d/a.sock" --udp-port "$PORT" --peer-udp-port $((PORT + 1)) 2>"$d/a.err" &
	pa=$!
	"$bin" serve -q --addr 127.0.0.1 --socket "$d/b.sock" --udp-port $((PORT + 1)) --peer-udp-port "$PORT" 2>"$d/b.err" &
	pb=$!
	pids="$pids $pa $pb"
	waitfile "$d/a.sock"
	waitfile "$d/b.sock"
	prof=""
	if [ -n "${PERF:-}" ]; then
		perf record -q -g -o "$d/perf.data" -p "$pa" 2>/dev/null &
		prof=$!
	elif [ -n "${STRACE:-}" ]; then
		strace -c -f -o "$d/strace.txt" -p "$pa" 2>/dev/null &
		prof=$!
	elif [ -n "${STAT:-}" ]; then
		perf stat -e context-switches,cpu-migrations,task-clock -p "$pa,$pb" -o "$d/stat.txt" 2>/dev/null &
		prof=$!
	fi
	[ -n "$prof" ] && sleep 0.5
	for t in $TESTS; do
		nexttcp
		case $t in
		lat)
			abipair lat ib_write_lat -x 0 -s "$SIZE_LAT" -n "$N" -p "$tcp"
			echo "$r $name lat $(latrow "$d/lat.cli")" >>"$RES"
			;;
		bw)
			abipair bw ib_write_bw -x 0 -s 65536 -n "${N_BW:-20000}" -p "$tcp"
			echo "$r $name bw $(bwrow "$d/bw.cli")" >>"$RES"
			;;
		readbw)
			abipair readbw ib_read_bw -x 0 -s 65536 -n "${N_BW:-20000}" -p "$tcp"
			echo "$r $name readbw $(bwrow "$d/readbw.cli")" >>"$RES"
			;;
		pingpong)
			abipair pp ibv_rc_pingpong -g 0 -s "$SIZE_PP" -n "$N" -p "$tcp" ${PP_ARGS:-}
			echo "$r $name pingpong $(pprow "$d/pp.cli")" >>"$RES"
			;;
		esac
		tail -1 "$RES" >&2
	done
	if [ -n "$prof" ]; then
		kill -INT "$prof" 2>/dev/null || true
		wait "$prof" 2>/dev/null || true
	fi
	# The daemons' counters (a binary without the status command writes nothing).
	for x in a b; do
		"$bin" status --json --socket "$d/$x.sock" >"$d/status.$x.json" 2>/dev/null || true
	done
	kill $pa $pb 2>/dev/null || true
	wait $pa $pb 2>/dev/null || true
}

# goapi ROUND: the Go API's tools on their own ports.
goapi() {
	r=$1
	bin=${VARIANTS%%:*}
	bin=${bin#*=}
	d="$OUT/go.$r"
	mkdir -p "$d"
	for t in $TESTS; do
		nexttcp
		case $t in
		lat)
			$T "$bin" lat --server --bind 127.0.0.1 --udp-port $((PORT + 10)) --port "$tcp" -s "$SIZE_LAT" -n "$N" >"$d/lat.srv" 2>&1 &
			s=$!
			waittcp "$tcp"
			$T "$bin" lat --bind 127.0.0.1 --udp-port $((PORT + 11)) --port "$tcp" -s "$SIZE_LAT" -n "$N" 127.0.0.1 >"$d/lat.cli" 2>&1 || true
			wait $s || echo "server exit $?" >>"$d/$t.srv.exit"
			echo "$r go lat $(latrow "$d/lat.cli")" >>"$RES"
			;;
		bw)
			$T "$bin" bw --server --bind 127.0.0.1 --udp-port $((PORT + 14)) --port "$tcp" -s 65536 -mtu 4096 -n "${N_BW:-20000}" >"$d/bw.srv" 2>&1 &
			s=$!
			waittcp "$tcp"
			$T "$bin" bw --bind 127.0.0.1 --udp-port $((PORT + 15)) --port "$tcp" -s 65536 -mtu 4096 -n "${N_BW:-20000}" 127.0.0.1 >"$d/bw.cli" 2>&1 || true
			wait $s || echo "server exit $?" >>"$d/$t.srv.exit"
			echo "$r go bw $(bwrow "$d/bw.cli")" >>"$RES"
			;;
		readbw)
			$T "$bin" bw --server --bind 127.0.0.1 --udp-port $((PORT + 16)) --port "$tcp" --test read -s 65536 -mtu 4096 -n "${N_BW:-20000}" >"$d/readbw.srv" 2>&1 &
			s=$!
			waittcp "$tcp"
			$T "$bin" bw --bind 127.0.0.1 --udp-port $((PORT + 17)) --port "$tcp" --test read -s 65536 -mtu 4096 -n "${N_BW:-20000}" 127.0.0.1 >"$d/readbw.cli" 2>&1 || true
			wait $s || echo "server exit $?" >>"$d/$t.srv.exit"
			echo "$r go readbw $(bwrow "$d/readbw.cli")" >>"$RES"
			;;
		pingpong)
			$T "$bin" pingpong --bind 127.0.0.1 --udp-port $((PORT + 12)) --peer-udp-port $((PORT + 13)) -s "$SIZE_PP" -n "$N" -p "$tcp" >"$d/pp.srv" 2>&1 &
			s=$!
			waittcp "$tcp"
			$T "$bin" pingpong --bind 127.0.0.1 --udp-port $((PORT + 13)) --peer-udp-port $((PORT + 12)) -s "$SIZE_PP" -n "$N" -p "$tcp" 127.0.0.1 >"$d/pp.cli" 2>&1 || true
			wait $s || echo "server exit $?" >>"$d/$t.srv.exit"
			echo "$r go pingpong $(pprow "$d/pp.cli")" >>"$RES"
			;;
		esac
		tail -1 "$RES" >&2
	done
}

r=1
while [ $r -le "$ROUNDS" ]; do
	for v in $VARIANTS; do
		name=${v%%=*}
		rest=${v#*=}
		abi "$name" "${rest%%:*}" "${rest#*:}" $r
	done
	goapi $r
	r=$((r + 1))
done

echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# path test: typical / average / 99% (us) ranges over $ROUNDS rounds; pingpong: us/iter; bw: MB/s"
awk '
function lo(a, b) { return a == "" || b + 0 < a + 0 ? b : a }
function hi(a, b) { return a == "" || b + 0 > a + 0 ? b : a }
NF >= 4 && $4 != "" {
	k = $2 " " $3; keys[k] = 1
	for (i = 4; i <= NF; i++) { mn[k, i] = lo(mn[k, i], $i); mx[k, i] = hi(mx[k, i], $i) }
	nf[k] = NF
}
END {
	for (k in keys) {
		s = k ":"
		for (i = 4; i <= nf[k]; i++) s = s (i > 4 ? " /" : "") " " mn[k, i] "-" mx[k, i]
		print s
	}
}' "$RES" | sort
