#!/usr/bin/env bash
# The full test tier, what CI runs: every test of the SDK's and the tools'
# modules against real etcd members and ZooKeeper servers, and Kubernetes'
# storage tests on the routed client (integrations/kubernetes). Installs
# Debian's zookeeper, and prometheus for promtool, when missing (their
# services are not started). Flags given to it go to every go test run
# (-run, -v, -count=1).
set -euo pipefail
cd "$(dirname "$0")"

{ test -e /usr/share/java/zookeeper.jar && command -v promtool >/dev/null; } ||
	(apt-get update && apt-get install -y --no-install-recommends zookeeper prometheus)

# Two lanes at once, each one package at a time, of about equal length:
# ZooKeeper's tests, the benchmark harness's and then Kubernetes' (which
# mostly wait on their own etcd), beside everything else. One go test
# with -p 2 left the cores a third idle while the Kubernetes module ran
# after it; three lanes were no faster and loaded the cores so that tests
# timed for a busy neighbour failed (a cold run: 1,048 s for the etcd
# package). The packages with tests that skip under the race detector
# (testutil.SkipUnderRace: the simulator's and the router's long
# computations) run again without it, at the end of lane two.
lane1=(./tools/backends/zk/... ./tools/bench/...)
all=$(go list ./... ./tools/...)
mapfile -t lane2 < <(grep -vE '/tools/(backends/zk|bench)(/|$)' <<<"$all")
((${#lane2[@]} > 10)) || { echo "test.sh: the second lane's packages: ${lane2[*]}" >&2; exit 1; }
grep -qx 'github.com/oproute/oproute/tools/bench' <<<"$all" || { echo "test.sh: no package tools/bench" >&2; exit 1; }
# The packages whose tests skip under the race detector, found by their
# calls, run again without it.
mapfile -t norace < <(grep -rl --include='*_test.go' --exclude-dir=integrations 'testutil.SkipUnderRace' . | xargs -r dirname | sort -u)
((${#norace[@]} >= 2)) || { echo "test.sh: the packages to run without the race detector: ${norace[*]}" >&2; exit 1; }

# A signal to the script ends every lane, test binaries first (each ends
# its clusters' processes with it). Each process is stopped before its
# children are listed, so that a lane cannot start its next go test
# between its step's end and its own.
killtree() {
	[ -n "$1" ] || return 0
	local c
	kill -STOP "$1" 2>/dev/null || return 0
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do killtree "$c"; done
	kill -TERM "$1" 2>/dev/null
	kill -CONT "$1" 2>/dev/null || true
}
first= second= prebuild= prebuilt= etcdprebuild= warmup=
trap 'killtree "$warmup"; killtree "$first"; killtree "$second"; killtree "$prebuild"; killtree "$etcdprebuild"; rm -rf "$prebuilt"; exit 130' INT TERM HUP

# Two builds run in the background at the lowest priority while the
# lanes run, taking only what the lanes leave idle (from empty caches
# each is minutes of one core; warm, a cache hit): the Kubernetes
# module's test packages, compiled but not linked (go list -export: go
# test links them), which lane one waits for before that module's tests
# (their failure is those tests' to report), and the older etcd servers
# of the compatibility matrix, which TestServerVersions, last in the etcd
# package, would otherwise build then. Before the lanes start, one go
# list compiles both lanes' packages and their tests on both cores: from
# empty caches each lane's go test -p 1 compiles one package at a time,
# and the two lanes compiled what they share twice (their builds took
# 179 s so, 145 s with it first); warm, it is a cache hit.
prebuilt=$(mktemp -d)
(
	cd integrations/kubernetes && nice -n 19 go list -race -test -export -e ./... >/dev/null 2>&1 || true
	touch "$prebuilt/.done"
) &
prebuild=$!
nice -n 19 go run ./tools/testbed/internal/etcdprebuild >/dev/null 2>&1 &
etcdprebuild=$!
go list -race -test -export -e ./... ./tools/... >/dev/null &
warmup=$!
wait "$warmup" || true # a package that does not build fails in its lane
warmup=

# Each lane runs all its steps, a failed one too, and fails if any did.
lane_one() {
	local rc=0
	go test -race -p 1 -timeout 25m "$@" "${lane1[@]}" || rc=$?
	until [ -e "$prebuilt/.done" ]; do sleep 1; done # not this subshell's child: no wait
	# Its two packages at once: they mostly wait on etcd clusters of their
	# own (one at a time they left the cores 54 to 78 % idle).
	(cd integrations/kubernetes && go test -race -p 2 -timeout 15m "$@" ./...) || rc=$?
	return "$rc"
}
lane_two() {
	local rc=0
	go test -race -p 1 -timeout 25m "$@" "${lane2[@]}" || rc=$?
	go test -p 1 -timeout 10m "$@" "${norace[@]}" || rc=$?
	return "$rc"
}
# timed runs a lane and says how long it took: the lanes' lengths are
# what to balance.
timed() {
	local name=$1 start=$SECONDS rc=0
	shift
	"$@" || rc=$?
	echo "test.sh: $name ended (exit $rc) after $((SECONDS - start)) s" >&2
	return "$rc"
}
timed "lane one" lane_one "$@" &
first=$!
timed "lane two" lane_two "$@" &
second=$!

rc=0
wait "$second" || rc=$?
wait "$first" || rc=$?
wait "$prebuild" || true
rm -rf "$prebuilt"
wait "$etcdprebuild" || true # by now a cache hit: the tests built the same
exit "$rc"
