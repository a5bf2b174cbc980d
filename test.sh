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
# ZooKeeper's tests, the test bed's and then Kubernetes' (which mostly
# wait on their own etcd), beside everything else. One go test with -p 2
# left the cores a third idle while the Kubernetes module ran after it.
lane1=(./tools/backends/zk/... ./tools/testbed/...)
all=$(go list ./... ./tools/...)
mapfile -t lane2 < <(grep -v -e '/tools/backends/zk' -e '/tools/testbed' <<<"$all")
((${#lane2[@]} > 10)) || { echo "test.sh: the second lane's packages: ${lane2[*]}" >&2; exit 1; }

lane_one() {
	go test -race -p 1 -timeout 25m "$@" "${lane1[@]}" &&
		(cd integrations/kubernetes && go test -race -p 1 -timeout 15m "$@" ./...)
}
lane_one "$@" &
first=$!
go test -race -p 1 -timeout 25m "$@" "${lane2[@]}" &
second=$!

# A signal to the script ends both lanes, test binaries first (each ends
# its clusters' processes with it).
killtree() {
	local c
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do killtree "$c"; done
	kill -TERM "$1" 2>/dev/null || true
}
trap 'killtree "$first"; killtree "$second"; exit 130' INT TERM HUP

rc=0
wait "$second" || rc=$?
wait "$first" || rc=$?
exit "$rc"
