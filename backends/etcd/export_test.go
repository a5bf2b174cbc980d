package etcd

// What the external tests (package etcd_test) need of the unexported.
var TxnIsReadOnly = txnIsReadOnly
