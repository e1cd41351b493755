package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/batonhq/baton/backend"
)

// The queue of the processes waiting for a Lease (backend.RecordQueue) is
// a second Lease object beside it, so that joining the queue never writes
// the Lease itself: a write there would change its resourceVersion, which
// every waiter counts as a renewal of the holder's.
const (
	// QueueSuffix ends the name of a lease's queue object: the processes
	// waiting for Lease NAME queue in the Lease NAME + QueueSuffix, whose
	// AnnotationQueue lists them, head first. Lease names ending in it are
	// refused (CheckLeaseName).
	QueueSuffix = ".baton-queue"
	// AnnotationQueue holds a queue object's waiting processes, head
	// first, as a JSON array of strings.
	AnnotationQueue = "batonhq.github.io/queue"
	// AnnotationNext holds, on a released Lease, the process it was
	// released to (the head of its queue then); waiting processes leave
	// it to that one for a short reservation (see backend.RecordQueue).
	AnnotationNext = "batonhq.github.io/next"
	// AnnotationHolderProcess holds, on a held Lease, the holder's process
	// (backend.RecordBackend.Process) and, after a space, its
	// holderIdentity, so that a takeover from a holder that stopped
	// renewing takes that process out of the queue too. A client-go
	// elector keeps the annotation when it takes the Lease; the identity
	// in it then differs from holderIdentity, and it is ignored.
	AnnotationHolderProcess = "batonhq.github.io/holder-process"
	// LabelQueueOf labels a queue object with "true", so that
	// `kubectl get leases -l batonhq.github.io/queue-of` lists them.
	LabelQueueOf = "batonhq.github.io/queue-of"
)

// maxQueue is how many processes one queue object lists at most: process
// names are at most 64 characters, so a full queue stays far below the
// API server's 256 KiB for all of an object's annotations. A process that
// finds the queue full waits without a place in it (it races the others
// at each release, as without a queue).
const maxQueue = 1000

// errQueueFull is JoinQueue's answer when the queue lists maxQueue processes.
var errQueueFull = errors.New("the queue is full")

var _ backend.RecordQueue = (*Store)(nil)

// queueName returns the name of name's queue object, or "" when that
// would be longer than an object name may be.
func queueName(name string) string {
	q := name + QueueSuffix
	if len(q) > 253 {
		return ""
	}
	return q
}

// JoinQueue implements backend.RecordQueue.
func (s *Store) JoinQueue(ctx context.Context, name, process string) error {
	return s.editQueue(ctx, name, func(q []string) ([]string, error) {
		q = slices.DeleteFunc(q, func(p string) bool { return p == process })
		if len(q) >= maxQueue {
			return nil, errQueueFull
		}
		return append(q, process), nil
	})
}

// LeaveQueue implements backend.RecordQueue.
func (s *Store) LeaveQueue(ctx context.Context, name, process string) error {
	return s.editQueue(ctx, name, func(q []string) ([]string, error) {
		if !slices.Contains(q, process) {
			return nil, nil
		}
		return slices.DeleteFunc(q, func(p string) bool { return p == process }), nil
	})
}

// DropQueueHead implements backend.RecordQueue.
func (s *Store) DropQueueHead(ctx context.Context, name, process string) error {
	return s.editQueue(ctx, name, func(q []string) ([]string, error) {
		if len(q) == 0 || q[0] != process {
			return nil, nil
		}
		return q[1:], nil
	})
}

// QueueHead implements backend.RecordQueue with a read of the queue
// object (a quorum read, as Get's).
func (s *Store) QueueHead(ctx context.Context, name, skip string) (string, error) {
	qn := queueName(name)
	if qn == "" {
		return "", nil
	}
	l, err := s.leases.Get(ctx, qn, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s.rememberQueue(qn, nil)
		return "", nil
	}
	if err != nil {
		return "", err
	}
	s.rememberQueue(qn, l)
	q, err := decodeQueue(l)
	if err != nil {
		return "", err
	}
	for _, p := range q {
		if p != skip {
			return p, nil
		}
	}
	return "", nil
}

// editQueue applies edit to name's queue in an update conditional on the
// queue object's resourceVersion (a create when there is none), reading
// it again and retrying when another process's update came first. edit
// returning nil, nil means no change is needed.
func (s *Store) editQueue(ctx context.Context, name string, edit func([]string) ([]string, error)) error {
	qn := queueName(name)
	if qn == "" {
		return fmt.Errorf("kubernetes: lease %q: its name is too long for a queue object beside it (%q + %q is over 253 characters)", name, name, QueueSuffix)
	}
	l, known := s.queueSeen(qn)
	for attempt := 0; ; attempt++ {
		// fresh is set when l was read in this call: a copy remembered
		// from earlier may be stale, which a write finds out (a
		// conflict) but a decision to write nothing would not.
		fresh := !known
		if !known {
			got, err := s.leases.Get(ctx, qn, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				l = nil
			case err != nil:
				return err
			default:
				l = got
			}
			known = true
		}
		var q []string
		if l != nil {
			var err error
			if q, err = decodeQueue(l); err != nil {
				return err
			}
		}
		q, err := edit(slices.Clone(q))
		if !fresh && (err == nil && q == nil || errors.Is(err, errQueueFull)) {
			known = false // nothing to change, or full, in what we saw: read it
			continue
		}
		if err != nil || q == nil {
			return err
		}
		var got *coordinationv1.Lease
		if l == nil {
			nl := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: qn, Namespace: s.namespace, Labels: map[string]string{LabelQueueOf: "true"}}}
			if err = encodeQueue(nl, q); err != nil {
				return err
			}
			got, err = s.leases.Create(ctx, nl, metav1.CreateOptions{})
		} else {
			nl := l.DeepCopy()
			if err = encodeQueue(nl, q); err != nil {
				return err
			}
			got, err = s.leases.Update(ctx, nl, metav1.UpdateOptions{})
		}
		switch {
		case err == nil:
			s.rememberQueue(qn, got)
			return nil
		case (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)) && attempt < 20:
			known = false // another process's update came first: read it
		default:
			return err
		}
	}
}

// queueSeen returns the queue object last read or written, and whether
// one (or its absence) is known.
func (s *Store) queueSeen(qn string) (*coordinationv1.Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.queues[qn]
	return l, ok
}

// rememberQueue keeps l as the queue object qn last seen (nil: none).
func (s *Store) rememberQueue(qn string, l *coordinationv1.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.queues[qn]; old != nil && l != nil && rvOf(old) > rvOf(l) {
		return
	}
	s.queues[qn] = l
}

// decodeQueue reads a queue object's processes.
func decodeQueue(l *coordinationv1.Lease) ([]string, error) {
	a, ok := l.Annotations[AnnotationQueue]
	if !ok || a == "" {
		return nil, nil
	}
	var q []string
	if err := json.Unmarshal([]byte(a), &q); err != nil {
		return nil, fmt.Errorf("kubernetes: queue object %s/%s: annotation %s is not a JSON array of strings: %v; delete the object (waiting processes queue again at their next wait)", l.Namespace, l.Name, AnnotationQueue, err)
	}
	return q, nil
}

// encodeQueue writes q into a queue object.
func encodeQueue(l *coordinationv1.Lease, q []string) error {
	a, err := json.Marshal(q)
	if err != nil {
		return err
	}
	setAnnotation(l, AnnotationQueue, string(a))
	return nil
}
