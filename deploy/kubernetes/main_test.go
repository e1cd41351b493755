package kubernetes

import (
	"os"
	"testing"

	"github.com/batonhq/baton/internal/testserver"
)

// TestMain stops the kube-apiserver the tests share. They run one at a
// time, each in namespaces of its own.
func TestMain(m *testing.M) {
	code := m.Run()
	testserver.StopSharedKubeAPIServer()
	os.Exit(code)
}
