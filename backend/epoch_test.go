package backend

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestCheckLogsEpochChanges: Check logs nothing for a first or an unchanged
// epoch, a WARN for a higher one and an ERROR for a lower one, each naming
// the lease, the key and both epochs.
func TestCheckLogsEpochChanges(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	w := EpochLocation{Store: "etcd", Counter: "revisions", Lease: "job", Kind: "key", Key: "baton/job!epoch"}
	var tr EpochTracker
	check := func(e uint64, want ...string) {
		t.Helper()
		buf.Reset()
		got, err := tr.Check(log, w, FormatEpoch(e))
		if err != nil || got != e {
			t.Fatalf("Check(%d) = %d, %v", e, got, err)
		}
		out := buf.String()
		if len(want) == 0 && out != "" {
			t.Errorf("Check(%d) logged %q; want nothing", e, out)
		}
		for _, s := range want {
			if !strings.Contains(out, s) {
				t.Errorf("Check(%d) logged %q; want it to contain %q", e, out, s)
			}
		}
	}
	check(100)
	check(100)
	check(200, "level=WARN", "the lease's epoch changed: etcd lost its data (its revisions started again)",
		"lease=job", "key=baton/job!epoch", `old_epoch="100 `, `new_epoch="200 `)
	check(150, "level=ERROR", "the lease's epoch went backwards: etcd lost its data",
		"lease=job", `old_epoch="200 `, `new_epoch="150 `)
	if n := tr.Next("job", EpochTime(10)); n != 201 {
		t.Errorf("Next after seeing 200 = %d, want 201", n)
	}

	// A store-wide epoch names no lease.
	w = EpochLocation{Store: "ZooKeeper", Counter: "zxids", Kind: "node", Key: "/baton/.baton-epoch"}
	check(100)
	check(300, "level=WARN", "the epoch changed: ZooKeeper lost its data (its zxids started again)", "node=/baton/.baton-epoch")
	if strings.Contains(buf.String(), "lease=") {
		t.Errorf("a store-wide epoch's change names a lease: %q", buf.String())
	}
}

// TestCheckRefusesBadEpoch: a value that is not an epoch is an error that
// names the key, the lease and how to delete the key.
func TestCheckRefusesBadEpoch(t *testing.T) {
	var tr EpochTracker
	w := EpochLocation{Store: "etcd", Lease: "job", Kind: "key", Key: "baton/job!epoch", Delete: "etcdctl del baton/job!epoch"}
	_, err := tr.Check(slog.New(slog.DiscardHandler), w, "soon")
	want := `epoch key baton/job!epoch of lease "job": epoch "soon" is not a positive whole number`
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "; delete it (etcdctl del baton/job!epoch) and baton writes a new one") {
		t.Errorf("Check(soon) = %v; want %s…; delete it (etcdctl del …) and baton writes a new one", err, want)
	}
	w = EpochLocation{Store: "ZooKeeper", Kind: "node", Key: "/.baton-epoch"}
	if _, err := tr.Check(slog.New(slog.DiscardHandler), w, "0"); err == nil || !strings.HasPrefix(err.Error(), "epoch node /.baton-epoch: ") || !strings.HasSuffix(err.Error(), "; delete it and baton writes a new one") {
		t.Errorf("Check(0) = %v", err)
	}
}
