package statusapi

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the Prometheus metrics of a Handler, in a registry of their
// own (with the Go runtime and process collectors), served at GET /metrics.
// `baton agent` and `baton run --http` serve the same names; "held here"
// means by a client of the agent, or by the process itself:
//
//	baton_is_leader{lease}                        gauge: 1 while the lease is held here
//	baton_transitions_total{lease,kind,reason}    counter: lease events the source reported
//	baton_term_duration_seconds{lease}            histogram: length of ended terms
//	baton_campaign_wait_seconds{lease}            histogram: queued to elected, per candidate
//	baton_renew_latency_seconds                   histogram: raft session renewals' round trip to the raft leader (raft members only)
//	baton_renew_errors_total                      counter: failed raft session renewals (raft members only)
//	baton_safe_until_margin_seconds{lease}        gauge, at scrape: safe-until minus now of leases held here
//	baton_lease_table_up                          gauge, at scrape: 1 if the scrape could read the leases from the source
//
// The series of a lease go when the handler forgets the lease: at the first
// scrape, page view or new lease name after its last term ended more than
// the history window ago (an hour by default), or to make room among the
// leases remembered (Options.MaxLeases). So a handler that sees ever new
// lease names does not grow its metrics without bound; a lease that comes
// back starts its counters afresh, which rate() and increase() read as a
// reset. (A lease not remembered at all, because MaxLeases leases all have
// running terms, keeps its series.)
//
// Make one with NewMetrics before a raft member starts, pass OnRenew to
// raft.NodeOptions.OnRenew, and the Metrics to New through Options. One
// Metrics serves one Handler. Safe for concurrent use.
type Metrics struct {
	reg          *prometheus.Registry
	isLeader     *prometheus.GaugeVec
	transitions  *prometheus.CounterVec
	termDuration *prometheus.HistogramVec
	waitDuration *prometheus.HistogramVec
	renewLatency prometheus.Histogram
	renewErrors  prometheus.Counter

	mu    sync.Mutex
	bound bool
	prune func() // set by bind
}

// NewMetrics returns the metrics, registered in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		isLeader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "baton_is_leader",
			Help: "1 while the lease is held here (by a client of this agent: a Backend or agent:// process campaigning through this member; or by this baton run itself), else 0.",
		}, []string{"lease"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "baton_transitions_total",
			Help: "Lease events this process saw, by kind (queued, dequeued, elected, released, lost) and, for released and lost, reason.",
		}, []string{"lease", "kind", "reason"}),
		termDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "baton_term_duration_seconds",
			Help: "How long terms lasted, observed when a term ends (released or lost), on this process's clock.",
			// 1 s to about 3 days.
			Buckets: prometheus.ExponentialBuckets(1, 4, 10),
		}, []string{"lease"}),
		waitDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "baton_campaign_wait_seconds",
			Help: "How long a candidate waited in the queue, from queued to elected (candidates elected without queuing are not observed).",
			// 10 ms to about 2 days.
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 12),
		}, []string{"lease"}),
		renewLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "baton_renew_latency_seconds",
			Help: "Round trip of successful session renewals this member served or forwarded to the raft leader, for its own Backends and agent:// clients.",
			// 1 ms to about 16 s.
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		renewErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "baton_renew_errors_total",
			Help: "Session renewals this member served or forwarded that failed.",
		}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.isLeader, m.transitions, m.termDuration, m.waitDuration, m.renewLatency, m.renewErrors,
	)
	return m
}

// Registry returns the registry the metrics are in, to add collectors of
// one's own or to gather in tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// OnRenew records one session renewal: pass it as raft.NodeOptions.OnRenew.
// A failed renewal counts in baton_renew_errors_total and not in the
// latency histogram.
func (m *Metrics) OnRenew(took time.Duration, err error) {
	if err != nil {
		m.renewErrors.Inc()
		return
	}
	m.renewLatency.Observe(took.Seconds())
}

func (m *Metrics) transition(ev raft.LeaseEvent) {
	m.transitions.WithLabelValues(ev.Lease, string(ev.Kind), ev.Reason).Inc()
}

func (m *Metrics) setLeader(lease string, here bool) {
	v := 0.0
	if here {
		v = 1
	}
	m.isLeader.WithLabelValues(lease).Set(v)
}

func (m *Metrics) termEnded(lease string, d time.Duration) {
	m.termDuration.WithLabelValues(lease).Observe(d.Seconds())
}

func (m *Metrics) campaignWait(lease string, d time.Duration) {
	m.waitDuration.WithLabelValues(lease).Observe(max(d, 0).Seconds())
}

// gatherer gathers the registry after pruning, so that a scrape does not
// show the series of leases forgotten by then.
func (m *Metrics) gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		m.mu.Lock()
		prune := m.prune
		m.mu.Unlock()
		if prune != nil {
			prune()
		}
		return m.reg.Gather()
	})
}

// forget deletes every series of lease.
func (m *Metrics) forget(lease string) {
	l := prometheus.Labels{"lease": lease}
	m.isLeader.DeletePartialMatch(l)
	m.transitions.DeletePartialMatch(l)
	m.termDuration.DeletePartialMatch(l)
	m.waitDuration.DeletePartialMatch(l)
}

// bind registers the collector that reads src's lease table at scrape, and
// prune, which forgets the leases idle beyond the window, to run before.
func (m *Metrics) bind(src Source, prune func(), timeout time.Duration, log *slog.Logger) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bound {
		return errors.New("statusapi: these Metrics serve another Handler already: make one Metrics per Handler")
	}
	m.bound = true
	m.prune = prune
	return m.reg.Register(&tableCollector{src: src, timeout: timeout, log: log,
		margin: prometheus.NewDesc("baton_safe_until_margin_seconds",
			"Safe-until minus now, at scrape, of each lease held here: how long it stays the holder's without another renewal.",
			[]string{"lease"}, nil),
		up: prometheus.NewDesc("baton_lease_table_up",
			"1 if this scrape could read the lease table from the backend (through the raft leader, for a raft member) within the read timeout, else 0.",
			nil, nil),
	})
}

// tableCollector reads the lease table at each scrape, bounded by a
// timeout, so that a scrape of a member cut off from its group answers
// (with baton_lease_table_up 0) instead of hanging.
type tableCollector struct {
	src        Source
	timeout    time.Duration
	log        *slog.Logger
	margin, up *prometheus.Desc
}

func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.margin
	ch <- c.up
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	infos, err := c.src.Leases(ctx)
	if err != nil {
		c.log.Debug("metrics: reading the lease table", "err", err)
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	now := time.Now()
	for _, in := range infos {
		if !heldHere(c.src, in.Holder, in.Member) || in.SafeUntil.IsZero() {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.margin, prometheus.GaugeValue, in.SafeUntil.Sub(now).Seconds(), in.Name)
	}
}
