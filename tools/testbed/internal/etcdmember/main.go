// Command etcdmember runs one test-bed etcd member. The test bed builds it
// when the host binary is race-instrumented, so that servers run at full
// speed; the member spec comes in the environment and package testbed's
// init runs it.
package main

import (
	"fmt"
	"os"

	_ "github.com/oproute/oproute/tools/testbed"
)

func main() {
	fmt.Fprintln(os.Stderr, "etcdmember: started by package testbed only")
	os.Exit(2)
}
