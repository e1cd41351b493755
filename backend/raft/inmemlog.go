package raft

import (
	"sync"

	hraft "github.com/hashicorp/raft"
)

// inmemLogs is the log store of a member without a DataDir: raft's
// InmemStore, given a copy of each entry. InmemStore keeps the *Log it is
// handed, and on the raft leader that is a field of the entry's future, so
// it would keep the whole future (its error channel, and the FSM's reply to
// the entry) for as long as the entry stays in the log: until a snapshot
// has compacted it, at least TrailingLogs entries later. The copies, and
// their data, are carved out of blocks of a few hundred entries: a burst
// of entries (10,000 acquisitions) stays in the log for long, and as
// separate small objects among the garbage the burst also makes they would
// pin partly empty pages of the heap long after that garbage went. A
// block goes once the log has dropped all its entries (raft drops them
// oldest first).
type inmemLogs struct {
	*hraft.InmemStore

	mu   sync.Mutex
	logs []hraft.Log // the current block of entries; its free part is cap-len
	data []byte      // the current block of entry data
}

// The sizes of inmemLogs' blocks; data larger than an eighth of a block
// gets its own copy.
const (
	logBlock  = 256
	dataBlock = 32 << 10
)

func newInmemLogs() *inmemLogs { return &inmemLogs{InmemStore: hraft.NewInmemStore()} }

// StoreLog implements hraft.LogStore.
func (s *inmemLogs) StoreLog(l *hraft.Log) error { return s.StoreLogs([]*hraft.Log{l}) }

// StoreLogs implements hraft.LogStore.
func (s *inmemLogs) StoreLogs(ls []*hraft.Log) error {
	cp := make([]*hraft.Log, len(ls))
	s.mu.Lock()
	for i, l := range ls {
		if len(s.logs) == cap(s.logs) {
			s.logs = make([]hraft.Log, 0, logBlock)
		}
		s.logs = append(s.logs, *l)
		c := &s.logs[len(s.logs)-1]
		c.Data = s.keep(l.Data)
		cp[i] = c
	}
	s.mu.Unlock()
	return s.InmemStore.StoreLogs(cp)
}

// keep returns a copy of b, in the current data block if it is small.
func (s *inmemLogs) keep(b []byte) []byte {
	if b == nil {
		return nil
	}
	if len(b) > dataBlock/8 {
		return append([]byte(nil), b...)
	}
	if cap(s.data)-len(s.data) < len(b) {
		s.data = make([]byte, 0, dataBlock)
	}
	start := len(s.data)
	s.data = append(s.data, b...)
	return s.data[start:len(s.data):len(s.data)]
}
