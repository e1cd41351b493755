package kubernetes

import (
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/batonhq/baton/backend"
)

// Annotations baton keeps on a Lease besides client-go's LeaseLock fields.
// client-go's LeaderElector rewrites a Lease's spec only, from the object it
// read, so it carries both over when it takes the Lease.
const (
	// AnnotationEpoch holds the epoch of the Lease's fencing tokens, in
	// decimal: baton sets it when it creates the Lease, or when it first
	// acquires a Lease without it, so that a Lease deleted and created
	// again starts its tokens above the old one's (see the package doc).
	// A Lease without it has epoch 0.
	AnnotationEpoch = "batonhq.github.io/token-epoch"
	// AnnotationState holds the lease's state (baton.StateTerm), in
	// standard base64. Absent means no state was ever stored.
	AnnotationState = "batonhq.github.io/state"
)

// Store is the backend.RecordStore of Lease objects in one namespace: a record is the
// Lease named after the baton lease, in client-go's LeaseLock layout, and
// its version is the Lease's resourceVersion. It is a backend.RecordNotifier too: a
// watch on the Lease wakes waiters. Safe for concurrent use.
type Store struct {
	leases    coordinationclient.LeaseInterface
	namespace string

	mu sync.Mutex
	// last is the newest Lease read or written per name: an update starts
	// from it when its resourceVersion is the one the caller expects, so
	// that labels, other annotations and spec fields baton does not manage
	// are kept.
	last map[string]*coordinationv1.Lease
	// watching counts the running Notify watches per name: while one
	// runs, last follows the Lease's changes, and Peek serves it.
	watching map[string]int
	// queues is the queue object last read or written, by its name; nil
	// when it did not exist then.
	queues map[string]*coordinationv1.Lease
}

var (
	_ backend.RecordStore    = (*Store)(nil)
	_ backend.RecordNotifier = (*Store)(nil)
	_ backend.RecordPeeker   = (*Store)(nil)
)

// NewStore returns a Store of the Leases in namespace, through client.
func NewStore(client k8s.Interface, namespace string) *Store {
	return &Store{
		leases:    client.CoordinationV1().Leases(namespace),
		namespace: namespace,
		last:      map[string]*coordinationv1.Lease{},
		watching:  map[string]int{},
		queues:    map[string]*coordinationv1.Lease{},
	}
}

// Namespace returns the namespace of the Store's Leases.
func (s *Store) Namespace() string { return s.namespace }

// Get implements backend.RecordStore. A Get without a resourceVersion is a quorum
// read from etcd, so it is linearizable.
func (s *Store) Get(ctx context.Context, name string) (backend.LeaseRecord, uint64, error) {
	l, err := s.leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s.remember(name, nil)
		return backend.LeaseRecord{}, 0, nil
	}
	if err != nil {
		return backend.LeaseRecord{}, 0, err
	}
	rec, v, err := s.decode(l)
	if err != nil {
		return backend.LeaseRecord{}, 0, err
	}
	s.remember(name, l)
	return rec, v, nil
}

// CompareAndSwap implements backend.RecordStore: a create when version is 0, else an
// update conditional on resourceVersion version.
func (s *Store) CompareAndSwap(ctx context.Context, name string, version uint64, rec backend.LeaseRecord) (uint64, error) {
	if version == 0 {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.namespace}}
		if err := encode(l, rec); err != nil {
			return 0, err
		}
		got, err := s.leases.Create(ctx, l, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("%w: Lease %s/%s exists already: %v", backend.ErrConflict, s.namespace, name, err)
		}
		if err != nil {
			return 0, err
		}
		return s.written(name, got, version)
	}
	base := s.lastAt(name, version)
	if base == nil {
		// Not the version we last saw: read it, so as to keep what others
		// keep in it, and refuse at once if it moved on.
		l, err := s.leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("%w: Lease %s/%s is gone", backend.ErrConflict, s.namespace, name)
		}
		if err != nil {
			return 0, err
		}
		if l.ResourceVersion != strconv.FormatUint(version, 10) {
			return 0, fmt.Errorf("%w: Lease %s/%s is at resourceVersion %s, not %d", backend.ErrConflict, s.namespace, name, l.ResourceVersion, version)
		}
		base = l
	}
	l := base.DeepCopy()
	if err := encode(l, rec); err != nil {
		return 0, err
	}
	got, err := s.leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("%w: Lease %s/%s: %v", backend.ErrConflict, s.namespace, name, err)
	}
	if err != nil {
		return 0, err
	}
	return s.written(name, got, version)
}

// written checks the Lease a write returned and remembers it.
func (s *Store) written(name string, got *coordinationv1.Lease, old uint64) (uint64, error) {
	v, err := strconv.ParseUint(got.ResourceVersion, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kubernetes: Lease %s/%s: resourceVersion %q is not a number; baton needs an API server backed by etcd", s.namespace, name, got.ResourceVersion)
	}
	if v == old {
		// The server found nothing to change and wrote nothing; encode
		// always moves renewTime, so this is not a write baton made.
		return 0, fmt.Errorf("kubernetes: Lease %s/%s: the update kept resourceVersion %d", s.namespace, name, v)
	}
	s.remember(name, got)
	return v, nil
}

// remember keeps l as the newest Lease seen for name, unless a newer one
// (a higher resourceVersion: a watch event can arrive after a read or
// write that saw a later one) is kept already; nil forgets it.
func (s *Store) remember(name string, l *coordinationv1.Lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l == nil {
		delete(s.last, name)
		return
	}
	if old := s.last[name]; old != nil && rvOf(old) > rvOf(l) {
		return
	}
	s.last[name] = l
}

// rvOf is l's resourceVersion as a number, 0 when it is none.
func rvOf(l *coordinationv1.Lease) uint64 {
	v, _ := strconv.ParseUint(l.ResourceVersion, 10, 64)
	return v
}

// Peek implements backend.RecordPeeker: while a Notify watch follows name,
// the newest Lease it, a read or a write delivered, so that a waiter woken
// by the watch decides from the event's Lease and reads nothing. A holder's
// renewals so cost its waiting processes no request.
func (s *Store) Peek(name string) (backend.LeaseRecord, uint64, bool) {
	s.mu.Lock()
	l := s.last[name]
	on := s.watching[name] > 0
	s.mu.Unlock()
	if !on || l == nil {
		return backend.LeaseRecord{}, 0, false
	}
	rec, v, err := s.decode(l)
	if err != nil {
		return backend.LeaseRecord{}, 0, false
	}
	return rec, v, true
}

// lastAt returns the Lease last seen for name if it is at version.
func (s *Store) lastAt(name string, version uint64) *coordinationv1.Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.last[name]
	if l == nil || l.ResourceVersion != strconv.FormatUint(version, 10) {
		return nil
	}
	return l
}

// decode reads a Lease as a backend.LeaseRecord and a version.
func (s *Store) decode(l *coordinationv1.Lease) (backend.LeaseRecord, uint64, error) {
	v, err := strconv.ParseUint(l.ResourceVersion, 10, 64)
	if err != nil {
		return backend.LeaseRecord{}, 0, fmt.Errorf("kubernetes: Lease %s/%s: resourceVersion %q is not a number; baton needs an API server backed by etcd", l.Namespace, l.Name, l.ResourceVersion)
	}
	var rec backend.LeaseRecord
	sp := l.Spec
	if sp.HolderIdentity != nil {
		rec.Holder = *sp.HolderIdentity
	}
	if sp.LeaseDurationSeconds != nil && *sp.LeaseDurationSeconds > 0 {
		rec.TTL = time.Duration(*sp.LeaseDurationSeconds) * time.Second
	}
	if sp.AcquireTime != nil {
		rec.Since = sp.AcquireTime.Time
	}
	var transitions uint64
	if sp.LeaseTransitions != nil && *sp.LeaseTransitions > 0 {
		transitions = uint64(*sp.LeaseTransitions)
	}
	var epoch uint64
	if a, ok := l.Annotations[AnnotationEpoch]; ok {
		epoch, err = strconv.ParseUint(a, 10, 32)
		if err != nil {
			return backend.LeaseRecord{}, 0, fmt.Errorf("kubernetes: Lease %s/%s: annotation %s=%q is not an epoch (a decimal number of seconds since 2025-01-01 UTC): restore it or delete the Lease", l.Namespace, l.Name, AnnotationEpoch, a)
		}
	}
	rec.Token = epoch<<32 | transitions
	if rec.Holder == "" {
		rec.Next = l.Annotations[AnnotationNext]
	} else if p, holder, ok := strings.Cut(l.Annotations[AnnotationHolderProcess], " "); ok && holder == rec.Holder {
		rec.Process = p
	}
	if a, ok := l.Annotations[AnnotationState]; ok {
		rec.State, err = base64.StdEncoding.DecodeString(a)
		if err != nil {
			return backend.LeaseRecord{}, 0, fmt.Errorf("kubernetes: Lease %s/%s: annotation %s is not base64: %v; restore it or remove it (the lease's state is then lost)", l.Namespace, l.Name, AnnotationState, err)
		}
		if rec.State == nil {
			rec.State = []byte{}
		}
	}
	return rec, v, nil
}

// encode writes rec into l's spec (client-go's LeaseLock layout) and
// annotations. renewTime is the time of the write, and always moves
// forward from l's, so that every write changes the record, and client-go
// electors, which time a holder from the last change they saw, count it
// as a renewal.
func encode(l *coordinationv1.Lease, rec backend.LeaseRecord) error {
	transitions := rec.Token & math.MaxUint32
	if transitions > math.MaxInt32 {
		return fmt.Errorf("kubernetes: Lease %s/%s: token %d does not fit leaseTransitions (an int32)", l.Namespace, l.Name, rec.Token)
	}
	holder := rec.Holder
	secs := int32(min(math.MaxInt32, (rec.TTL+time.Second-1)/time.Second))
	secs = max(secs, 1)
	tr := int32(transitions)
	now := metav1.NewMicroTime(time.Now().UTC().Truncate(time.Microsecond))
	if prev := l.Spec.RenewTime; prev != nil && !now.After(prev.Time) {
		now = metav1.NewMicroTime(prev.Add(time.Microsecond))
	}
	l.Spec.HolderIdentity = &holder
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.LeaseTransitions = &tr
	l.Spec.RenewTime = &now
	l.Spec.AcquireTime = nil
	if !rec.Since.IsZero() {
		at := metav1.NewMicroTime(rec.Since.UTC().Truncate(time.Microsecond))
		l.Spec.AcquireTime = &at
	}
	if epoch := rec.Token >> 32; epoch != 0 || l.Annotations[AnnotationEpoch] != "" {
		setAnnotation(l, AnnotationEpoch, strconv.FormatUint(epoch, 10))
	}
	if rec.Next == "" {
		delete(l.Annotations, AnnotationNext)
	} else {
		setAnnotation(l, AnnotationNext, rec.Next)
	}
	if rec.Process == "" {
		delete(l.Annotations, AnnotationHolderProcess)
	} else {
		setAnnotation(l, AnnotationHolderProcess, rec.Process+" "+rec.Holder)
	}
	if rec.State == nil {
		delete(l.Annotations, AnnotationState)
	} else {
		setAnnotation(l, AnnotationState, base64.StdEncoding.EncodeToString(rec.State))
	}
	return nil
}

func setAnnotation(l *coordinationv1.Lease, k, v string) {
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[k] = v
}

// watchRetry is how long the Store waits before it watches again after a
// watch could not be started.
const watchRetry = 250 * time.Millisecond

// Notify implements backend.RecordNotifier with a watch on the Lease, started before
// Notify returns: a change after that wakes the channel. The watch is
// restarted, from the last resourceVersion seen, whenever the server ends
// it; each restart wakes the channel too, in case a change fell between.
func (s *Store) Notify(ctx context.Context, name string) (<-chan struct{}, error) {
	w, err := s.watch(ctx, name, "")
	if err != nil {
		return nil, err
	}
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.watching[name]++
	s.mu.Unlock()
	go func() {
		defer func() {
			s.mu.Lock()
			if s.watching[name]--; s.watching[name] == 0 {
				delete(s.watching, name)
			}
			s.mu.Unlock()
		}()
		s.follow(ctx, name, w, ch)
	}()
	return ch, nil
}

func (s *Store) watch(ctx context.Context, name, rv string) (watch.Interface, error) {
	return s.leases.Watch(ctx, metav1.ListOptions{
		FieldSelector:       fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion:     rv,
		AllowWatchBookmarks: true,
	})
}

func (s *Store) follow(ctx context.Context, name string, w watch.Interface, ch chan<- struct{}) {
	wake := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	rv := ""
	for {
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Bookmark:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					rv = l.ResourceVersion
				}
			case watch.Error:
				// Typically 410 Gone: the resourceVersion is too old to
				// resume from; start from the present.
				rv = ""
			case watch.Deleted:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					rv = l.ResourceVersion
				}
				s.remember(name, nil)
				wake()
			default:
				if l, ok := ev.Object.(*coordinationv1.Lease); ok {
					rv = l.ResourceVersion
					s.remember(name, l)
				}
				wake()
			}
		}
		w.Stop()
		for {
			if ctx.Err() != nil {
				return
			}
			var err error
			w, err = s.watch(ctx, name, rv)
			if err == nil {
				break
			}
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(watchRetry):
			}
		}
		// Changes may have passed while no watch ran: the waiter reads
		// the Lease again rather than peek at what may be stale.
		s.remember(name, nil)
		wake()
	}
}
