// Package bench compares routing policies end to end: the same workload
// against the same cluster, policies interleaved trial by trial, exact
// percentiles per operation class, and tables of mean ± sd with the ratio
// to a baseline. cmd/routebench is its command line.
//
// # Loop model
//
// Workers run a closed loop: each issues its next operation when the last
// one completes, and the latency of an operation is measured from issue to
// completion. Throughput is therefore an outcome of the fixed concurrency,
// and latencies are service times under that concurrency; there is no
// coordinated-omission correction because there is no intended schedule to
// correct against. This is the paper's model (N concurrent workers). After
// a failed operation a worker pauses 10 ms before the next, so that instant
// refusals (a dead member) are counted rather than spun on.
//
// # Backends
//
// A Backend starts clusters (on the test bed, with fault knobs) or attaches
// to external endpoints (AttachOptions: TLS, credentials, zones; the
// runner writes there under Options.KeyPrefix and deletes what it wrote
// when done, unless Options.KeepKeys), and connects clients by policy
// name. Scenarios and reports use only that, with two exceptions a new
// backend meets: the scenarios bound to a store (the zk-* ones, etcd's
// stock clients, range reads) name it, and CPU budgets reach the test-bed
// backends by type (BudgetsOf, withBudgets).
package bench
