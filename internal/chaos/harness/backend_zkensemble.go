package harness

import "errors"

// newZooKeeperEnsemble returns a three-server ZooKeeper ensemble backend.
func newZooKeeperEnsemble(dir string, n int) (backend, error) {
	return nil, errors.New("zookeeper-ensemble: not yet")
}
