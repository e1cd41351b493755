package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
)

// BenchmarkAWSHandOver measures, on the hand-over tests' three instances
// (real baton processes on raft://, each with its own metadata mock), how
// long the lease holder's instance takes to hand over when it leaves the
// group: handover-ms from its child's stop to a standby's child's start,
// notice-to-complete-ms from the notice (the metadata showing it) to
// CompleteLifecycleAction. Run it with
//
//	go test -run '^$' -bench AWSHandOver -benchtime 1x ./cmd/baton
//
// On a spot notice the group begins the termination 2s after the notice,
// and the metadata shows the target lifecycle state Terminated 4s after
// it, as the hand-over test simulates; the lifecycle action can be
// completed only once it exists, so notice-to-complete-ms includes that.
func BenchmarkAWSHandOver(b *testing.B) {
	b.Run("LifecycleHook", func(b *testing.B) {
		benchAWSHandOver(b, "22", func(f *awsfake.Server, in *awsInstance) {
			in.mock.Stop()
			in.mock = startMock(b, in.mock.Port, in.cfg, "asglifecycle", "--asg-termination-delay-sec", "0")
			f.BeginTermination(in.id)
		})
	})
	b.Run("SpotNotice", func(b *testing.B) {
		benchAWSHandOver(b, "23", func(f *awsfake.Server, in *awsInstance) {
			in.mock.Stop()
			in.mock = startMock(b, in.mock.Port, in.cfg, "--mock-delay-sec", "0", "--rebalance-delay-sec", "3600", "--asg-termination-delay-sec", "4")
			time.AfterFunc(2*time.Second, func() { f.BeginTermination(in.id) })
		})
	})
}

// benchAWSHandOver starts a group, waits for a lease holder, makes its
// instance leave by notice (which returns once the notice shows in the
// instance's metadata) and reports the hand-over's times.
func benchAWSHandOver(b *testing.B, net3 string, notice func(*awsfake.Server, *awsInstance)) {
	var handover, complete time.Duration
	for range b.N {
		b.StopTimer()
		f, file, insts, old, first := ledAWSGroup(b, net3)

		b.StartTimer()
		notice(f, old)
		noticeAt := time.Now()
		testkit.Eventually(b, 60*time.Second, "a standby's child to start", func() bool { return len(starts(readEvents(file))) >= 2 })
		var done *awsfake.LifecycleCall
		testkit.Eventually(b, 60*time.Second, "CompleteLifecycleAction", func() bool {
			for _, c := range f.LifecycleCalls() {
				if c.Action == "CompleteLifecycleAction" && c.Error == "" {
					done = &c
					return true
				}
			}
			return false
		})
		b.StopTimer()

		evs := readEvents(file)
		second := starts(evs)[1]
		stopped, ok := stopOf(evs, first.pid)
		if !ok {
			b.Fatalf("the leaving instance's child %d never logged its stop", first.pid)
		}
		if second.others != 0 || second.holder == old.id {
			b.Fatalf("not a hand-over: %+v after %+v", second, first)
		}
		handover += time.Duration(second.at - stopped.at)
		complete += done.At.Sub(noticeAt)
		for _, in := range insts {
			_ = in.baton.cmd.Process.Signal(syscall.SIGTERM)
		}
		for _, in := range insts {
			in.baton.wait(b, 60*time.Second)
		}
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(handover.Milliseconds())/float64(b.N), "handover-ms")
	b.ReportMetric(float64(complete.Milliseconds())/float64(b.N), "notice-to-complete-ms")
}
