#!/usr/bin/env bash
# The full test tier, what CI runs: every test of the SDK's and the tools'
# modules against real etcd members and ZooKeeper servers, and beside them
# Kubernetes' storage tests on the routed client (integrations/kubernetes).
# Installs Debian's zookeeper, and prometheus for promtool, when missing
# (their services are not started). Extra arguments go to both go test
# runs (-run, -v, -count=1).
set -euo pipefail
cd "$(dirname "$0")"

{ test -e /usr/share/java/zookeeper.jar && command -v promtool >/dev/null; } ||
	(apt-get update && apt-get install -y --no-install-recommends zookeeper prometheus)

# Kubernetes' test binaries are the largest build: built first, so that
# the build never loads the cores under the tests that measure.
(cd integrations/kubernetes && go test -race -run '^$' ./... >/dev/null)

# The Kubernetes tests wait on their own etcd cluster most of the time:
# beside the main run they fill cores its slowest packages leave idle,
# and its output follows the main run's.
k8slog=$(mktemp)
(cd integrations/kubernetes && exec go test -race -p 1 -timeout 15m "$@" ./...) >"$k8slog" 2>&1 &
k8s=$!
trap 'kill "$k8s" 2>/dev/null; wait "$k8s" 2>/dev/null; rm -f "$k8slog"' EXIT

rc=0
go test -race -p 2 -timeout 25m "$@" ./... ./tools/... || rc=$?
k8src=0
wait "$k8s" || k8src=$?
cat "$k8slog"
if [ "$rc" -ne 0 ]; then
	exit "$rc"
fi
exit "$k8src"
