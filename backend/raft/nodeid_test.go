package raft

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton"
)

// TestNodeIDFile: the ID in DataDir/node-id is taken as written by this
// package (the ID and one newline) and refused, naming the file and the
// characters an ID may have, when it is anything else; it is never
// trimmed into some other ID.
func TestNodeIDFile(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		content string
		want    string // "" for an error
	}{
		{"node-1\n", "node-1"},
		{"node-1", "node-1"},
		{"web_1.eu-west", "web_1.eu-west"},
		{"node 1\n", ""},
		{" node-1\n", ""},
		{"node-1 \n", ""},
		{"node-1\n\n", ""},
		{"node-1\r\n", ""},
		{"node-1\x00", ""},
		{"\n", ""},
		{"", ""},
		{"nöde\n", ""},
		{strings.Repeat("a", maxIDLen+1), ""},
	} {
		dir := t.TempDir()
		file := filepath.Join(dir, "node-id")
		if err := os.WriteFile(file, []byte(tt.content), 0o600); err != nil {
			t.Fatal(err)
		}
		id, err := nodeID(NodeOptions{DataDir: dir})
		if tt.want != "" {
			if err != nil || id != tt.want {
				t.Errorf("node-id %q: got %q, %v; want %q", tt.content, id, err, tt.want)
			}
			continue
		}
		var ce *baton.ConfigError
		if err == nil || !errors.As(err, &ce) {
			t.Errorf("node-id %q: got ID %q, err %v; want a ConfigError", tt.content, id, err)
			continue
		}
		for _, w := range []string{file, "letters, digits, '-', '_' and '.'", "remove the data dir"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("node-id %q: error %q does not mention %q", tt.content, err, w)
			}
		}
	}
}

// TestNodeIDWritten: a new member's ID is written so that it reads back.
func TestNodeIDWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	id, err := nodeID(NodeOptions{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	again, err := nodeID(NodeOptions{DataDir: dir})
	if err != nil || again != id {
		t.Fatalf("read back %q, %v; want %q", again, err, id)
	}
	if err := checkID(id); err != nil {
		t.Fatalf("new ID %q: %v", id, err)
	}
}

func TestNodeOptionsID(t *testing.T) {
	t.Parallel()
	o := NodeOptions{ID: "a b", BindAddr: "127.0.0.1:0", Secret: "0123456789abcdef"}
	err := o.fill()
	if err == nil || !strings.Contains(err.Error(), `ID "a b"`) {
		t.Fatalf("fill with ID %q: %v; want a problem naming it", o.ID, err)
	}
}

// A member's made ID starts with its Name, made fit for an ID, and is new
// at every start without a data dir; with one, the stored ID stays.
func TestNodeIDFromName(t *testing.T) {
	t.Parallel()
	a, _ := nodeID(NodeOptions{Name: "m2"})
	b, _ := nodeID(NodeOptions{Name: "m2"})
	if !strings.HasPrefix(a, "m2-") || len(a) != len("m2-")+16 || a == b {
		t.Errorf("in-memory IDs named m2: %q and %q; want m2-<16 hex digits>, new each time", a, b)
	}
	if id, _ := nodeID(NodeOptions{Name: "web-1.example.com/3f2a9c1d"}); !strings.HasPrefix(id, "web-1.example.com.3f2a9c1d-") || checkID(id) != nil {
		t.Errorf("ID named by a default candidate ID: %q", id)
	}
	if id, _ := nodeID(NodeOptions{Name: strings.Repeat("x", 200)}); len(id) != 64+1+16 || checkID(id) != nil {
		t.Errorf("ID of a long name: %d bytes (%v)", len(id), checkID(id))
	}
	if id, _ := nodeID(NodeOptions{}); !strings.HasPrefix(id, "node-") {
		t.Errorf("ID without a name: %q, want node-...", id)
	}
	dir := t.TempDir()
	first, err := nodeID(NodeOptions{DataDir: dir, Name: "m1"})
	if err != nil || !strings.HasPrefix(first, "m1-") {
		t.Fatalf("first ID in a data dir: %q, %v", first, err)
	}
	if again, err := nodeID(NodeOptions{DataDir: dir, Name: "renamed"}); err != nil || again != first {
		t.Errorf("ID after a restart with another name: %q, %v; want the stored %q", again, err, first)
	}
}
