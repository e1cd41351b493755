// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 at
// the version this module pins, for the tests to run as a subprocess
// (internal/testserver.StartEtcd). It takes etcd's own flags.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
