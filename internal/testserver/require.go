// Package testserver starts real servers for tests: on loopback, on random
// ports, with data in temporary directories, and torn down by t.Cleanup.
//
// Servers that cannot run skip the test on a developer machine, where a
// missing binary should not block work on unrelated code, but fail it in CI,
// where a skipped backend would pass silently. CI opts into the strict
// behaviour by setting BATON_REQUIRE_SERVERS=1.
package testserver

import (
	"fmt"
	"os"
	"testing"
)

// RequireServersEnv is the environment variable that turns a missing server
// from a skip into a failure.
const RequireServersEnv = "BATON_REQUIRE_SERVERS"

// hints tell a developer how to get a server that Unavailable reported
// missing. Servers not listed get a generic hint.
var hints = map[string]string{
	"etcd": "testserver.StartEtcd runs etcd built once from tools/etcd " +
		"(`go run ./internal/testserver/buildtools` does it up front) " +
		"into $XDG_CACHE_HOME/baton-tools/etcd-v3.7.3-HASH (~/.cache when unset)",
	"zookeeper": "testserver.StartZooKeeper runs the Debian ZooKeeper 3.8 jars with java: " +
		"apt-get install zookeeper openjdk-17-jre-headless (jars in /usr/share/java)",
	"curator": "the Curator interop test compiles a Java program against Debian's Curator 5.4: " +
		"apt-get install libcurator-recipes-java openjdk-17-jdk-headless zookeeper",
	"consul": "testserver.StartConsul runs `consul agent -dev` (a server with ConsulOptions.Persist), built once from tools/consul " +
		"(a cold build takes minutes; `go run ./internal/testserver/buildtools` does it up front) " +
		"into $XDG_CACHE_HOME/baton-tools/consul-v1.20.6 (~/.cache when unset)",
	"dynalite": dynaliteHint,
	"kube-apiserver": "testserver.StartKubeAPIServer runs kube-apiserver on an etcd of its own, built once from tools/kubernetes " +
		"(a cold build takes minutes; `go run ./internal/testserver/buildtools` does it up front) " +
		"into $XDG_CACHE_HOME/baton-tools/kube-apiserver-v1.37.2 (~/.cache when unset)",
}

// RequireServers reports whether missing servers must fail tests rather than
// skip them, i.e. whether BATON_REQUIRE_SERVERS=1.
func RequireServers() bool {
	return os.Getenv(RequireServersEnv) == "1"
}

// Unavailable ends the test because server could not be reached or started,
// for the reason why. It skips the test unless RequireServers, in which case
// it fails it, so that CI cannot go green without exercising the backend.
func Unavailable(t testing.TB, server string, why error) {
	t.Helper()
	hint, ok := hints[server]
	if !ok {
		hint = fmt.Sprintf("install %s and make it reachable on 127.0.0.1", server)
	}
	if RequireServers() {
		t.Fatalf("%s unavailable: %v\n%s\n(failing rather than skipping because %s=1)",
			server, why, hint, RequireServersEnv)
	}
	t.Skipf("%s unavailable: %v\n%s\n(set %s=1 to fail instead of skip)",
		server, why, hint, RequireServersEnv)
}
