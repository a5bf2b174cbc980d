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

# Two lanes at once, each mostly one test binary at a time (go test -race
# -p 1), take the work from one queue, largest first: a lane that finishes an
# item takes the next, so that they end close together however the
# items' lengths move (the machine is shared). The items: ZooKeeper's
# package, etcd's, the Kubernetes module (its tests wait for its
# background build, below: a lane takes another item first while that
# runs), the test bed's, the other packages, the benchmark harness's, the
# router's, and last the packages whose tests skip under the race
# detector (testutil.SkipUnderRace: the simulator's and the router's long
# computations), again without it. One go test with -p 2 left the cores
# a third idle while the Kubernetes module ran after it; three lanes were
# no faster and loaded the cores so that tests timed for a busy
# neighbour failed (a cold run: 1,048 s for the etcd package).
all=$(go list ./... ./tools/...)
declare -A pkgs=([zk]=./tools/backends/zk/... [etcd]=./tools/backends/etcd/... [testbed]=./tools/testbed [bench]=./tools/bench/... [router]=./router)
named=$(go list ${pkgs[@]}) # fails if one of them is gone
pkgs[rest]=$(grep -vxF -f <(echo "$named") <<<"$all" | tr '\n' ' ')
(($(wc -w <<<"${pkgs[rest]}") > 10)) || { echo "test.sh: the other packages: ${pkgs[rest]}" >&2; exit 1; }
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
first= second= prebuild= prebuilt= etcdprebuild= warmup= queue=
trap 'killtree "$warmup"; killtree "$first"; killtree "$second"; killtree "$prebuild"; killtree "$etcdprebuild"; rm -rf "$prebuilt" ${queue:+"$queue" "$queue.lock"}; exit 130' INT TERM HUP

# Two builds run in the background at the lowest priority while the
# lanes run, taking only what the lanes leave idle (from empty caches
# each is minutes of one core; warm, a cache hit): the Kubernetes
# module's test packages, compiled but not linked (go list -export: go
# test links them), which that module's tests wait for (their failure
# is those tests' to report), and the older etcd servers
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

# next_item takes the queue's first item that can start (the Kubernetes
# module once its build is done, or when nothing else is left).
next_item() {
	(
		flock 9
		local q i
		mapfile -t q <"$queue"
		for i in "${!q[@]}"; do
			if [ "${q[i]}" != k8s ] || [ -e "$prebuilt/.done" ] || ((${#q[@]} == 1)); then
				echo "${q[i]}"
				unset 'q[i]'
				if ((${#q[@]})); then printf '%s\n' "${q[@]}"; fi >"$queue"
				return
			fi
		done
	) 9>"$queue.lock"
}
run_item() {
	local item=$1
	shift
	case $item in
	k8s)
		until [ -e "$prebuilt/.done" ]; do sleep 1; done # not this subshell's child: no wait
		# Its two packages at once: they mostly wait on etcd clusters of
		# their own (one at a time they left the cores 54 to 78 % idle).
		(cd integrations/kubernetes && go test -race -p 2 -timeout 15m "$@" ./...) ;;
	norace) go test -p 1 -timeout 10m "$@" "${norace[@]}" ;;
	# Small packages, no cluster among them: linking their test binaries
	# one at a time took 38 s.
	rest) go test -race -p 2 -timeout 25m "$@" ${pkgs[rest]} ;;
	*) go test -race -p 1 -timeout 25m "$@" ${pkgs[$item]} ;;
	esac
}
# Each lane runs items until the queue is empty, a failed one's next too,
# and fails if any failed; it says how long each took and it did: the
# items' lengths are what to order them by.
lane() {
	local name=$1 start=$SECONDS rc=0 item t0 irc
	shift
	while item=$(next_item) && [ -n "$item" ]; do
		t0=$SECONDS irc=0
		run_item "$item" "$@" || irc=$?
		echo "test.sh: $item ended (exit $irc) after $((SECONDS - t0)) s in lane $name" >&2
		((irc == 0)) || rc=$irc
	done
	echo "test.sh: lane $name ended (exit $rc) after $((SECONDS - start)) s" >&2
	return "$rc"
}
queue=$(mktemp)
printf '%s\n' zk etcd k8s testbed rest bench router norace >"$queue"
lane one "$@" &
first=$!
lane two "$@" &
second=$!

rc=0
wait "$second" || rc=$?
wait "$first" || rc=$?
# A lane that could not read the queue stopped early: what it left is a failure.
[ ! -s "$queue" ] || { echo "test.sh: items never run: $(tr '\n' ' ' <"$queue")" >&2; rc=1; }
wait "$prebuild" || true
rm -rf "$prebuilt" "$queue" "$queue.lock"
wait "$etcdprebuild" || true # by now a cache hit: the tests built the same
exit "$rc"
