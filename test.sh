#!/usr/bin/env bash
# The full test tier, what CI runs: every test of the SDK's and the tools'
# modules against real etcd members and ZooKeeper servers, then
# Kubernetes' storage tests on the routed client (integrations/kubernetes).
# Installs Debian's zookeeper, and prometheus for promtool, when missing
# (their services are not started). Flags given to it go to both go test
# runs (-run, -v, -count=1).
set -euo pipefail
cd "$(dirname "$0")"

{ test -e /usr/share/java/zookeeper.jar && command -v promtool >/dev/null; } ||
	(apt-get update && apt-get install -y --no-install-recommends zookeeper prometheus)

# One after the other: the Kubernetes tests build and test a patched
# kube-apiserver module on both cores, which beside the main run would
# load them under the tests that measure (testutil.HoldCores).
go test -race -p 2 -timeout 25m "$@" ./... ./tools/...
cd integrations/kubernetes
go test -race -p 1 -timeout 15m "$@" ./...
