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

# Three lanes at once, each one package at a time: ZooKeeper's tests;
# etcd's and the module consumer's; Kubernetes' (which mostly wait on their
# own etcd), then everything else. With two lanes the cores stood a fifth
# idle while both lanes' tests waited on timers and clusters.
# The simulator runs twice: under the race detector, where its long runs
# shrink to the quick tier's sizes (it is about ten times slower), and
# then without it at full size.
lane1=(./tools/backends/zk/...)
lane2=(./tools/backends/etcd/... ./tools/consumer/...)
all=$(go list ./... ./tools/...)
mapfile -t lane3 < <(grep -vE '/tools/(backends/(zk|etcd)|consumer)(/|$)' <<<"$all")
((${#lane3[@]} > 10)) || { echo "test.sh: the third lane's packages: ${lane3[*]}" >&2; exit 1; }
grep -qx 'github.com/oproute/oproute/tools/sim' <<<"$all" || { echo "test.sh: no simulator package" >&2; exit 1; }

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
first= second= third=
trap 'killtree "$first"; killtree "$second"; killtree "$third"; exit 130' INT TERM HUP

lane_three() {
	local rc=0
	(cd integrations/kubernetes && go test -race -p 1 -timeout 15m "$@" ./...) || rc=1
	go test -race -p 1 -timeout 25m "$@" "${lane3[@]}" || rc=1
	go test -p 1 -timeout 10m "$@" ./tools/sim || rc=1
	return "$rc"
}
go test -race -p 1 -timeout 25m "$@" "${lane1[@]}" &
first=$!
go test -race -p 1 -timeout 25m "$@" "${lane2[@]}" &
second=$!
lane_three "$@" &
third=$!

rc=0
wait "$second" || rc=$?
wait "$first" || rc=$?
wait "$third" || rc=$?
exit "$rc"
