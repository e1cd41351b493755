package testserver

import (
	"os"
	"os/exec"
	"testing"
)

// CuratorJars are Debian's Curator 5.4 and what a program using its
// LeaderLatch needs at run time; the jars' manifests name the rest (guava,
// zookeeper-jute, ...).
var CuratorJars = []string{"curator-recipes.jar", "curator-framework.jar", "curator-client.jar",
	"zookeeper.jar", "slf4j-api.jar", "slf4j-simple.jar"}

// CompileCurator compiles the Java source file src against CuratorJars into
// a temporary directory, and returns java and the class path to run it
// with. Without a JDK or the jars it ends the test through Unavailable.
func CompileCurator(t testing.TB, src string) (java, classPath string) {
	t.Helper()
	java, err := JavaTool("java")
	if err == nil {
		var javac string
		if javac, err = JavaTool("javac"); err == nil {
			if classPath, err = JavaClassPath(CuratorJars...); err == nil {
				dir := t.TempDir()
				out, cerr := exec.Command(javac, "-d", dir, "-cp", classPath, src).CombinedOutput()
				if cerr != nil {
					t.Fatalf("javac %s: %v\n%s", src, cerr, out)
				}
				return java, dir + string(os.PathListSeparator) + classPath
			}
		}
	}
	Unavailable(t, "curator", err)
	return "", ""
}
