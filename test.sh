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
mapfile -t lane3 < <(grep -v -e '/tools/backends/zk' -e '/tools/backends/etcd' -e '/tools/consumer' <<<"$all")
((${#lane3[@]} > 10)) || { echo "test.sh: the third lane's packages: ${lane3[*]}" >&2; exit 1; }
grep -qx 'github.com/oproute/oproute/tools/sim' <<<"$all" || { echo "test.sh: no simulator package" >&2; exit 1; }

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

# A signal to the script ends every lane, test binaries first (each ends
# its clusters' processes with it).
killtree() {
	local c
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do killtree "$c"; done
	kill -TERM "$1" 2>/dev/null || true
}
trap 'killtree "$first"; killtree "$second"; killtree "$third"; exit 130' INT TERM HUP

rc=0
wait "$second" || rc=$?
wait "$first" || rc=$?
wait "$third" || rc=$?
exit "$rc"
