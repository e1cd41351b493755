package kubernetes

import (
	"crypto/rand"
	"encoding/hex"
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

// unique returns prefix with a random suffix: a name that no other test,
// nor another run of the same one (-count) on the shared server, uses.
func unique(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}
