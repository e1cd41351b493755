package raft

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton"
	hraft "github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// Discoverer finds the addresses (host:port) of instances that may be
// members of the group; the discovery package has static, DNS and AWS Auto
// Scaling implementations. The list may include the caller's own address.
type Discoverer interface {
	Peers(ctx context.Context) ([]string, error)
}

// NodeOptions configures a Node. The zero value is not usable: BindAddr
// and Secret are required.
type NodeOptions struct {
	// ID is the member's raft server ID. Empty (the default) means: read it
	// from DataDir/node-id, or make a new random one (and store it there when
	// DataDir is set). An ID must never be reused with a different log: a
	// voter that forgot its votes could vote twice in one election.
	ID string

	// Name, if set, begins an ID that the member makes (with no ID given
	// and none stored): NAME-<16 random hex digits> instead of
	// node-<16 random hex digits>, so that logs, /v1/group and the status
	// page show whose member it is (`baton run` gives its --id, `baton
	// agent` HOST-agent). Characters an ID cannot hold become '.', and a
	// long Name is cut to 64 bytes. The random part keeps each new member's
	// ID its own: an in-memory member gets a new one at every start. Empty
	// (the default) means "node".
	Name string

	// DataDir keeps the raft log, the stable store and snapshots across
	// restarts. Empty (the default) keeps them in memory: the member is a
	// new member at every start, with a new random ID, which is always
	// safe and suits instances that are replaced rather than restarted.
	DataDir string

	// BindAddr is the TCP address to listen on, such as "0.0.0.0:7946" or
	// "127.0.0.1:0". Required.
	BindAddr string

	// AdvertiseAddr is the address peers reach this member at. Empty (the
	// default) means the bound address, which must then be a specific IP
	// (not 0.0.0.0 or ::).
	AdvertiseAddr string

	// TLS is the member's mutual-TLS configuration in CA mode: it must
	// present a certificate (Certificates or GetCertificate) and verify
	// peers against the group's CA (RootCAs and ClientCAs). Members speak
	// TLS 1.3 only (the member uses a copy with MinVersion raised);
	// internal/certs and `baton tls` make one, and Node.SetTLS replaces it
	// while the member runs.
	//
	// Nil (the default) is the secret-only mode: the member makes a key
	// and a self-signed certificate in memory at start, requires one of
	// every peer without verifying it against a CA, and authenticates
	// peers by their proof of Secret alone (selfsigned.go says what that
	// trusts). All members of a group use the same mode: a CA-mode member
	// refuses a self-signed peer, and a secret-only member's certificate
	// is no CA's.
	TLS *tls.Config

	// Secret is the group's shared secret. Every connection between
	// members, raft's own and the group API's, proves it both ways, bound
	// to the TLS session: a certificate without the secret gets nothing.
	// At least MinSecretLen (16) bytes, and random: in secret-only mode a
	// guessable secret can be searched for offline. Required.
	Secret string

	// PreviousSecrets are further secrets the member accepts from peers,
	// and proves when a peer refuses Secret: during a rotation, members
	// that hold the old and the new secret let in those that hold either
	// (ParseSecrets, Node.SetSecrets). Each at least MinSecretLen bytes.
	// Default none.
	PreviousSecrets []string

	// Reloader, if set, is asked every ReloadEvery for the member's
	// secrets and (CA mode) TLS configuration, which then replace those in
	// use, as SetSecrets and SetTLS do: a rotation without a restart. Nil
	// (the default) keeps those given here for the member's life.
	Reloader Reloader

	// ReloadEvery is how often Reloader is asked. Default
	// DefaultReloadEvery (30 s). A step of a rotation must reach every
	// member before the next one starts: wait at least this long between
	// them.
	ReloadEvery time.Duration

	// Discovery finds peers. Nil means no peers: with BootstrapExpect 1
	// the member forms a group of its own.
	Discovery Discoverer

	// BootstrapExpect is how many members must be seen, none of them in a
	// group yet, before a new group forms; the seen member with the lowest
	// ID then bootstraps it, as in Consul. 0 (the default) means never
	// bootstrap: only join a group that exists, unless ExpectCounter is
	// set.
	BootstrapExpect int

	// ExpectCounter, if set, decides BootstrapExpect when no live group
	// is found: the member waits for the count it returns (the aws
	// package's ASG: min(desired capacity, 3) once that many instances
	// are InService), then bootstraps as with that BootstrapExpect. The
	// first count it returns holds for the member's life. BootstrapExpect
	// must then be 0. Nil (the default) means BootstrapExpect as given.
	ExpectCounter ExpectCounter

	// Voters caps the number of voting members; the others are non-voters
	// that replicate the log. Default 3. Use 3 or 5: an even number adds no
	// fault tolerance. Voters go to as many hosts as the group has (a
	// host is the IP or name in a member's advertised address): two
	// members on one host, such as a `baton agent` beside a `baton run`,
	// are never both voters while a member on another host could vote in
	// their place, so that losing one host costs one vote. Only a group
	// with fewer hosts than Voters (all on one machine, say) has two
	// voters on one host.
	Voters int

	// Witness makes this member a voter that never campaigns for leases
	// and hands raft leadership on as soon as it gets it, so that two
	// application instances and a witness form a group that survives the
	// loss of any one of them.
	Witness bool

	// HeartbeatTimeout is raft's heartbeat and election timeout; a dead
	// raft leader is replaced after about one to three of these. It also
	// sets the margin a new raft leader adds to the sessions of an earlier
	// one (half of it) and how late a raft reply may come back and still
	// count (half of it). Default DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration

	// DeadServerAfter is how long a member may go unreachable from the
	// raft leader before autopilot may remove it from the configuration
	// (never below a quorum of Voters). Default 10 s.
	DeadServerAfter time.Duration

	// Departures, if set, is asked by the raft leader which members'
	// instances have departed (an Auto Scaling group reports them
	// Terminating or Terminated, or no longer has them), every
	// DeparturesEvery and at once when the configuration changes or a
	// member stops answering. A reported member is removed as soon as it
	// has not answered the leader for autopilot's contact threshold (twice
	// HeartbeatTimeout, at least 1 s), well before DeadServerAfter; a voter
	// only after a healthy non-voter has been promoted in its place when
	// there is one, and only while the voters that answer stay a majority
	// of those that remain. A reported member that still answers is never
	// removed on that word: the leader logs the disagreement (Warn, once
	// per member and reason) and keeps it. Nil (the default) means
	// autopilot's dead-server cleanup only.
	Departures Departures

	// Terminations, if set, proves which members are gone for good (the
	// aws package's ASG: their EC2 instances are terminated). A member
	// that has had no raft leader for RecoverAfter, and finds that every
	// member that does not answer is proven gone and that those that
	// answer are fewer than a quorum, recovers the group (recover.go;
	// docs/backends/raft.md). Nil (the default) means no automatic
	// recovery: such a member logs, at Error, what happened and the
	// command that recovers it.
	Terminations Terminations

	// RecoverAfter is how long a member must have had no raft leader
	// before it looks at whether the group lost its quorum. Default
	// DeadServerAfter.
	RecoverAfter time.Duration

	// MaxTTL is the longest session TTL the group grants: a longer one is
	// refused. After a recovery from a lost majority no lease is granted
	// for MaxTTL plus half a heartbeat timeout, so that every holder that
	// the lost members confirmed has reached its safe-until. Every member
	// must have the same. Default DefaultMaxTTL.
	MaxTTL time.Duration

	// DeparturesEvery is how often the raft leader asks Departures when
	// nothing changed. Default 5 s. Departures implementations cache their
	// answers (the ASG's for its CacheTTL), so this bounds how stale an
	// answer the leader acts on, not how often the platform is called.
	DeparturesEvery time.Duration

	// StabilizationTime is how long a new member must be healthy before
	// autopilot promotes it to voter. Default 2 s.
	StabilizationTime time.Duration

	// Logger receives log lines (group "raft"). Nil (the default) means
	// silent.
	Logger *slog.Logger

	// OnRenew, if set, is called after each session renewal this member
	// serves or forwards for its own Backends and agent:// clients, with
	// how long the round trip to the raft leader took and its error (nil
	// on success). Renewals forwarded by other members are not reported.
	// It is called on the renewing goroutine: keep it short (update a
	// metric). Default nil.
	OnRenew func(took time.Duration, err error)

	gate *gate // in-package tests: cut the member off

	wallClock func() time.Time // in-package tests: this member's wall clock (nil: time.Now)
}

// Node is one member of a baton raft group: it replicates the lease state,
// votes (if it is a voter), serves the group API to its peers, and is the
// Group that a Backend campaigns through. Safe for concurrent use.
type Node struct {
	opts   NodeOptions
	id     string
	addr   string // advertised
	log    *slog.Logger
	creds  *creds // the TLS configuration and secrets connections use
	fsm    *fsm
	raft   *raftHandle // the current raft instance; a recovery replaces it (recover.go)
	trans  *hraft.NetworkTransport
	mux    *mux
	http   *http.Server
	client *apiClient
	// forwards holds a token for each call forwarded to the raft leader
	// that takes a turn (see forwardJSON).
	forwards chan struct{}
	timers   *sessionTimers
	heard    *heardLog   // what this member heard from raft leaders, for the next one (heard.go)
	stalls   *stallWatch // whether this process stood still of late (heard.go)
	rlog     *raftLog    // hashicorp/raft's records, into log (raftlog.go)
	pilot    *autopilot.Autopilot
	pilotMu  sync.Mutex // orders the terms' autopilot stops and starts
	stores   []io.Closer
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	// nudge asks nudgeFollowers' goroutine for a no-op entry (leadership.go).
	nudge   chan struct{}
	joined  chan struct{}
	joinOne sync.Once
	// failed is closed, and failErr set, when the member gives up on
	// joining (membership goroutine; see Failed).
	failed   chan struct{}
	failErr  error
	refusals *refusalLog
	// departWarned and departRefused are what the departure watch logged
	// (departures.go).
	departWarned, departRefused onceLog
	// lastCertFaults are the peers whose handshakes failed on a
	// certificate in the last probe (membership goroutine).
	lastCertFaults []peerCertFault
	// expect is the count ExpectCounter returned, 0 before (membership
	// goroutine).
	expect int
	// lastConf is the configuration last logged (membership goroutine).
	lastConf string
	notify   chan bool

	// What a recovery restarts raft with (recover.go).
	raftConf  *hraft.Config
	logs      hraft.LogStore
	stable    hraft.StableStore
	snaps     hraft.SnapshotStore
	kept      keptTransport
	recoverMu sync.Mutex // one recovery at a time
	recMu     sync.Mutex
	rec       recoveryState

	mu       sync.Mutex
	ready    bool // raft leader with the log applied: may serve renewals and reads
	leading  context.CancelFunc
	lastSeen map[hraft.ServerID]time.Time
	closed   bool

	// secrets are those in creds, as given (SetSecrets).
	secretsMu sync.Mutex
	secrets   []string
	joinErr   error // why the last join attempt did not get the member in
}

// ErrNotLeader is returned by a group call that only the raft leader can
// serve when no leader is known or ready; callers retry.
var ErrNotLeader = errors.New("raft: no raft leader available")

// DefaultHeartbeatTimeout is NodeOptions.HeartbeatTimeout when it is zero.
// It is chosen for a member that shares a busy host with its application:
// the raft leader steps down only after a full heartbeat timeout without
// hearing from a quorum, and a follower campaigns only after one of
// silence, so a raft leader stopped or starved for up to about 1.1 s (the
// heartbeat timeout less the time since its last answered RPC) is neither
// replaced nor steps down; a reply may come back up to half of it
// (0.625 s) late and still count. A crashed raft leader is replaced after
// one to three of these (2.8 s median, 3.7 s at most measured), which
// overlaps DefaultTTL. A shorter one fails over sooner but loses terms to
// stalls of half a second (bench/: BenchmarkRaftUnderLoad,
// BenchmarkCrashFailoverRaftMember; docs/guarantees.md has the figures).
const DefaultHeartbeatTimeout = 1250 * time.Millisecond

// StartNode opens the stores, starts the raft member and its API, and begins
// to bootstrap or join a group in the background; Joined reports when it is
// in one. Close stops it.
func StartNode(opts NodeOptions) (*Node, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.WithGroup("raft")
	id, err := nodeID(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("raft: listen on %s: %w", opts.BindAddr, err)
	}
	advertise, err := advertiseAddr(opts.AdvertiseAddr, ln.Addr())
	if err != nil {
		ln.Close()
		return nil, err
	}
	tlsCfg := opts.TLS
	if tlsCfg == nil {
		if tlsCfg, err = selfSignedTLS(id); err != nil {
			ln.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{
		opts: opts, id: id, addr: advertise, log: log, creds: newCreds(tls13(tlsCfg), secretList(opts.Secret, opts.PreviousSecrets)...),
		fsm: newFSM(), ctx: ctx, cancel: cancel, joined: make(chan struct{}), nudge: make(chan struct{}, 1),
		failed: make(chan struct{}), refusals: newRefusalLog(log, 10*time.Second),
		lastSeen: map[hraft.ServerID]time.Time{}, heard: newHeardLog(),
		stalls: &stallWatch{gap: opts.HeartbeatTimeout / 4, after: opts.HeartbeatTimeout / 4, last: time.Now()},
	}
	n.secrets = secretList(opts.Secret, opts.PreviousSecrets)
	n.fsm.onEpoch = n.checkEpochClock
	n.client = newAPIClient(n.creds, opts.gate)
	n.forwards = make(chan struct{}, maxForwarded)
	n.mux = newMux(ln, n.creds, opts.gate, n.hasJoined, n.refusals)
	if err := n.startRaft(); err != nil {
		n.mux.close()
		for _, c := range n.stores {
			c.Close()
		}
		cancel()
		return nil, err
	}
	n.timers = newSessionTimers(n)
	n.http = &http.Server{Handler: n.handler(), ErrorLog: nil, ReadHeaderTimeout: 5 * time.Second}
	n.wg.Add(6)
	go n.sendNudges()
	go n.watchQuorum()
	go n.watchStalls()
	go func() { defer n.wg.Done(); _ = n.http.Serve(n.mux.api) }()
	go n.watchLeadership()
	go n.membership()
	if opts.Reloader != nil {
		n.wg.Add(1)
		go n.reload()
	}
	mode := "CA"
	if opts.TLS == nil {
		mode = "secret only"
	}
	log.Info("member started", "id", id, "addr", advertise, "voters", opts.Voters, "witness", opts.Witness, "tls", mode)
	return n, nil
}

func (o *NodeOptions) fill() error {
	var problems []string
	if o.BindAddr == "" {
		problems = append(problems, "raft: BindAddr is empty: give the address to listen on, such as 0.0.0.0:7946")
	}
	if o.TLS != nil {
		problems = append(problems, checkTLS(o.TLS)...)
	}
	if o.ID != "" {
		if err := checkID(o.ID); err != nil {
			problems = append(problems, fmt.Sprintf("raft: ID %q: %v", o.ID, err))
		}
	}
	problems = append(problems, checkSecrets(o.Secret, o.PreviousSecrets)...)
	if o.Voters == 0 {
		o.Voters = 3
	}
	if o.Voters < 1 || o.Voters > 9 {
		problems = append(problems, fmt.Sprintf("raft: Voters is %d: use 3 or 5", o.Voters))
	}
	if o.BootstrapExpect < 0 {
		problems = append(problems, fmt.Sprintf("raft: BootstrapExpect is %d: use 0 (join only) or the number of members to wait for", o.BootstrapExpect))
	}
	if o.ExpectCounter != nil && o.BootstrapExpect != 0 {
		problems = append(problems, fmt.Sprintf("raft: BootstrapExpect is %d and ExpectCounter is set: give one of them (ExpectCounter decides the count)", o.BootstrapExpect))
	}
	if o.DeparturesEvery == 0 {
		o.DeparturesEvery = defaultDeparturesEvery
	}
	if o.DeparturesEvery < 0 {
		problems = append(problems, fmt.Sprintf("raft: DeparturesEvery %s is negative: use 0 for the default (%s) or a positive duration", o.DeparturesEvery, defaultDeparturesEvery))
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.HeartbeatTimeout < 50*time.Millisecond {
		problems = append(problems, fmt.Sprintf("raft: HeartbeatTimeout %s is below 50ms", o.HeartbeatTimeout))
	}
	if o.DeadServerAfter == 0 {
		o.DeadServerAfter = 10 * time.Second
	}
	if o.DeadServerAfter < 2*o.HeartbeatTimeout {
		problems = append(problems, fmt.Sprintf("raft: DeadServerAfter %s must be at least twice HeartbeatTimeout (%s)", o.DeadServerAfter, o.HeartbeatTimeout))
	}
	if o.ReloadEvery == 0 {
		o.ReloadEvery = DefaultReloadEvery
	}
	if o.ReloadEvery < 0 {
		problems = append(problems, fmt.Sprintf("raft: ReloadEvery %s is negative: use 0 for the default (%s) or a positive duration", o.ReloadEvery, DefaultReloadEvery))
	}
	if o.StabilizationTime == 0 {
		o.StabilizationTime = 2 * time.Second
	}
	if o.RecoverAfter == 0 {
		o.RecoverAfter = o.DeadServerAfter
	}
	if o.RecoverAfter < 2*o.HeartbeatTimeout {
		problems = append(problems, fmt.Sprintf("raft: RecoverAfter %s must be at least twice HeartbeatTimeout (%s): a group must have time to elect before a member looks at whether it lost its quorum", o.RecoverAfter, o.HeartbeatTimeout))
	}
	if o.MaxTTL == 0 {
		o.MaxTTL = DefaultMaxTTL
	}
	if o.MaxTTL < 0 {
		problems = append(problems, fmt.Sprintf("raft: MaxTTL %s is negative: use 0 for the default (%s) or the longest session TTL the group grants", o.MaxTTL, DefaultMaxTTL))
	}
	if len(problems) > 0 {
		return &baton.ConfigError{Problems: problems}
	}
	return nil
}

// checkTLS returns the problems with a CA-mode TLS configuration.
func checkTLS(cfg *tls.Config) []string {
	var problems []string
	if len(cfg.Certificates) == 0 && cfg.GetCertificate == nil {
		return append(problems, "raft: TLS has no certificate: members must present one signed by the group's CA (or leave TLS nil for the secret-only mode)")
	}
	if cfg.RootCAs == nil || cfg.ClientCAs == nil {
		problems = append(problems, "raft: TLS must verify peers against the group's CA (set both RootCAs and ClientCAs), or be nil for the secret-only mode")
	}
	if cfg.ClientAuth != tls.RequireAndVerifyClientCert {
		problems = append(problems, "raft: TLS must require and verify client certificates (ClientAuth: tls.RequireAndVerifyClientCert): members authenticate each other")
	}
	if cfg.InsecureSkipVerify && cfg.VerifyConnection == nil && cfg.VerifyPeerCertificate == nil {
		problems = append(problems, "raft: TLS skips server verification with nothing in its place (InsecureSkipVerify without VerifyConnection)")
	}
	return problems
}

// checkSecrets returns the problems with a member's secrets.
func checkSecrets(secret string, previous []string) []string {
	var problems []string
	if len(secret) < MinSecretLen {
		problems = append(problems, fmt.Sprintf("raft: Secret is %d bytes: the group's join secret must be at least %d (try `openssl rand -hex 32`)", len(secret), MinSecretLen))
	}
	for i, p := range previous {
		if len(p) < MinSecretLen {
			problems = append(problems, fmt.Sprintf("raft: PreviousSecrets[%d] is %d bytes: every secret must be at least %d", i, len(p), MinSecretLen))
		}
	}
	return problems
}

// secretList is secret, then those of previous that differ from it, each
// once.
func secretList(secret string, previous []string) []string {
	out := []string{secret}
	for _, p := range previous {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// tls13 returns a copy of cfg that speaks TLS 1.3 only: the proofs of the
// secret are bound to the TLS session by exported keying material, which
// TLS 1.3 gives every session.
func tls13(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS13)
	return cfg
}

// SetSecrets replaces the secrets the member proves and accepts, without a
// restart: secret is the one it proves first, previous are also accepted
// (and proved when a peer refuses secret). Connections already made stay
// up, except those proved under a secret no longer held, which are
// closed; each new one uses the new secrets. A rotation runs in steps that
// each reach every member before the next (docs/aws.md, "Rotation"):
// accept the new secret beside the old (secret old, previous new), prove
// the new one (secret new, previous old), then drop the old. It returns a
// *baton.ConfigError, and changes nothing, when a secret is too short.
// Safe for concurrent use.
func (n *Node) SetSecrets(secret string, previous ...string) error {
	if problems := checkSecrets(secret, previous); len(problems) > 0 {
		return &baton.ConfigError{Problems: problems}
	}
	list := secretList(secret, previous)
	n.secretsMu.Lock()
	n.secrets = list
	n.creds.setSecrets(list)
	n.secretsMu.Unlock()
	return nil
}

// SetTLS replaces the member's CA-mode TLS configuration, without a
// restart: a renewed certificate, or a CA bundle that trusts a new CA
// beside the old one during a CA rotation. Connections already made stay
// up; each new one uses cfg. It returns a *baton.ConfigError, and changes
// nothing, when cfg is nil or is not a CA-mode configuration (NodeOptions.TLS
// says what one must hold), and on a member started in secret-only mode,
// which keeps its own certificate and needs none. Safe for concurrent use.
func (n *Node) SetTLS(cfg *tls.Config) error {
	if cfg == nil {
		return &baton.ConfigError{Problems: []string{"raft: SetTLS(nil): give a CA-mode TLS configuration"}}
	}
	if n.opts.TLS == nil {
		// A member switched to CA mode alone would refuse the
		// self-signed certificates of its secret-only peers.
		return &baton.ConfigError{Problems: []string{"raft: SetTLS on a member started in the secret-only mode (NodeOptions.TLS nil): a group changes modes by restarting its members with NodeOptions.TLS set, not one member at a time while running"}}
	}
	if problems := checkTLS(cfg); len(problems) > 0 {
		return &baton.ConfigError{Problems: problems}
	}
	n.creds.setTLS(tls13(cfg))
	return nil
}

// nodeID returns the configured ID, the one stored in DataDir, or a new one.
func nodeID(opts NodeOptions) (string, error) {
	if opts.DataDir == "" {
		if opts.ID != "" {
			return opts.ID, nil
		}
		return randomID(idPrefix(opts.Name)), nil
	}
	if err := os.MkdirAll(opts.DataDir, 0o700); err != nil {
		return "", fmt.Errorf("raft: data dir: %w", err)
	}
	file := filepath.Join(opts.DataDir, "node-id")
	b, err := os.ReadFile(file)
	switch {
	case err == nil:
		// The file holds the ID and, as this package writes it, one
		// newline. Anything else (spaces, a blank line, a NUL, an edit
		// gone wrong) is not trimmed into shape: an ID that changes is a
		// new member with an old log.
		stored := strings.TrimSuffix(string(b), "\n")
		if err := checkID(stored); err != nil {
			return "", &baton.ConfigError{Problems: []string{fmt.Sprintf(
				"raft: %s holds %q, not a member ID: %v; write the member's ID and at most one newline, or remove the data dir to start as a new member", file, b, err)}}
		}
		if opts.ID != "" && opts.ID != stored {
			return "", fmt.Errorf("raft: ID %q differs from %q stored in %s: a member's ID must not change while it keeps its log; remove the data dir to start as a new member", opts.ID, stored, file)
		}
		return stored, nil
	case errors.Is(err, os.ErrNotExist):
		id := opts.ID
		if id == "" {
			id = randomID(idPrefix(opts.Name))
		}
		if err := os.WriteFile(file, []byte(id+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("raft: store node id: %w", err)
		}
		return id, nil
	default:
		return "", fmt.Errorf("raft: read node id: %w", err)
	}
}

// maxIDLen bounds a member ID, which raft sends with every message.
const maxIDLen = 128

// checkID accepts the member IDs this package makes and reads: 1 to
// maxIDLen letters, digits, '-', '_' and '.'.
func checkID(id string) error {
	if id == "" {
		return errors.New("it is empty; an ID is 1 to 128 letters, digits, '-', '_' and '.'")
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("it is %d bytes; an ID is 1 to %d letters, digits, '-', '_' and '.'", len(id), maxIDLen)
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
		default:
			return fmt.Errorf("it contains %q; an ID is 1 to %d letters, digits, '-', '_' and '.'", r, maxIDLen)
		}
	}
	return nil
}

// idPrefix returns the start of an ID made for a member named name:
// "NAME-", with the characters checkID refuses as '.', at most 64 bytes of
// name; "node-" without a name.
func idPrefix(name string) string {
	if name == "" {
		return "node-"
	}
	b := []byte(name)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			b[i] = '.'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b) + "-"
}

func randomID(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func advertiseAddr(configured string, bound net.Addr) (string, error) {
	if configured != "" {
		host, port, err := net.SplitHostPort(configured)
		if err != nil || host == "" || port == "" {
			return "", fmt.Errorf("raft: AdvertiseAddr %q: want host:port", configured)
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return "", fmt.Errorf("raft: AdvertiseAddr %q: %s is no address peers can dial; give this instance's reachable address", configured, host)
		}
		return configured, nil
	}
	tcp, ok := bound.(*net.TCPAddr)
	if !ok || tcp.IP.IsUnspecified() {
		return "", fmt.Errorf("raft: bound to %s, which peers cannot dial: set AdvertiseAddr (--advertise) to this instance's reachable address", bound)
	}
	return tcp.String(), nil
}

func (n *Node) startRaft() error {
	// raft's records at their own levels, repeats rate-limited (raftlog.go).
	n.rlog = newRaftLog(n.log, RaftLogRepeatEvery)
	hlog := n.rlog.hclogger()
	conf := hraft.DefaultConfig()
	conf.LocalID = hraft.ServerID(n.id)
	conf.HeartbeatTimeout = n.opts.HeartbeatTimeout
	conf.ElectionTimeout = n.opts.HeartbeatTimeout
	// A raft leader that has heard from no quorum for a heartbeat timeout
	// steps down: no sooner than the followers start to campaign, so a
	// network blip that they ride out does not cost an election either.
	// Safety does not rest on it: every renewal and read is confirmed with
	// a quorum (verifyLeader).
	conf.LeaderLeaseTimeout = n.opts.HeartbeatTimeout
	// The raft leader sends each follower an AppendEntries every
	// CommitTimeout (up to twice that, randomised) beside its heartbeats,
	// only so that followers learn of commits when no entry follows; at
	// raft's 50 ms these were two thirds of an idle group's RPCs, and most
	// of its CPU. Followers learn of each commit from the no-op the leader
	// appends after it (nudgeFollowers), so this is only the fallback for a
	// nudge lost with its leader. Safety does not rest on it: heartbeats
	// (every HeartbeatTimeout/10) keep followers from campaigning, and
	// renewals are confirmed with VerifyLeader's own round of them.
	conf.CommitTimeout = n.opts.HeartbeatTimeout / 2
	conf.Logger = hlog
	conf.SnapshotThreshold = 8192
	notify := make(chan bool, 16)
	conf.NotifyCh = notify
	n.notify = notify

	var (
		logs   hraft.LogStore
		stable hraft.StableStore
		snaps  hraft.SnapshotStore
	)
	if n.opts.DataDir == "" {
		store := newInmemLogs()
		logs, stable, snaps = store, store.InmemStore, hraft.NewInmemSnapshotStore()
	} else {
		bolt, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(n.opts.DataDir, "raft.db")})
		if err != nil {
			return fmt.Errorf("raft: open log store in %s: %w", n.opts.DataDir, err)
		}
		n.stores = append(n.stores, bolt)
		fs, err := hraft.NewFileSnapshotStoreWithLogger(n.opts.DataDir, 2, hlog)
		if err != nil {
			return fmt.Errorf("raft: open snapshot store in %s: %w", n.opts.DataDir, err)
		}
		logs, stable, snaps = bolt, bolt, fs
	}
	tcpAdvertise, err := net.ResolveTCPAddr("tcp", n.addr)
	if err != nil {
		return fmt.Errorf("raft: advertise address %s: %w", n.addr, err)
	}
	n.trans = hraft.NewNetworkTransportWithConfig(&hraft.NetworkTransportConfig{
		Stream:  &streamLayer{chanListener: n.mux.raft, gate: n.opts.gate, creds: n.creds, advertise: tcpAdvertise},
		MaxPool: 3,
		Timeout: 5 * time.Second,
		// No pipelined replication. In hashicorp/raft v1.7.3, once a
		// pipeline's decoder stops (a follower answers with a newer term,
		// as a healed minority does), one more send can park for good,
		// and with it the replication goroutine: the member never shuts
		// down, and the follower gets no more entries while heartbeats
		// go on. Seen here: a holder that had just handed raft leadership
		// on, stopped by SIGTERM after a partition healed, hung in
		// Shutdown. A lease group's log is small; one append at a time
		// costs nothing that matters.
		MaxRPCsInFlight: 1,
		Logger:          hlog,
	})
	n.raftConf, n.logs, n.stable, n.snaps = conf, logs, stable, snaps
	n.kept = keptTransport{n.newHeardTransport(n.trans)}
	r, err := hraft.NewRaft(conf, n.fsm, logs, stable, snaps, n.kept)
	if err != nil {
		n.trans.Close()
		return fmt.Errorf("raft: start: %w", err)
	}
	n.raft = &raftHandle{}
	n.raft.set(r)
	n.pilot = autopilot.New(n.raft, &pilotDelegate{n}, autopilot.WithLogger(hlog),
		autopilot.WithPromoter(&cappedPromoter{voters: n.opts.Voters}),
		autopilot.WithUpdateInterval(n.opts.HeartbeatTimeout),
		autopilot.WithReconcileInterval(n.opts.HeartbeatTimeout))
	return nil
}

// ID returns the member's raft server ID.
func (n *Node) ID() string { return n.id }

// Addr returns the address peers reach the member at.
func (n *Node) Addr() string { return n.addr }

// Witness reports whether the member is a witness.
func (n *Node) Witness() bool { return n.opts.Witness }

// Joined is closed once the member is in a group that has a leader.
func (n *Node) Joined() <-chan struct{} { return n.joined }

// Status is a snapshot of a member's view of its group.
type Status struct {
	ID       string   // this member's ID
	Addr     string   // its advertised address
	State    string   // "Leader", "Follower", "Candidate" or "Shutdown"
	Leader   string   // the raft leader's ID; empty when none is known
	LeaderAt string   // the raft leader's address; empty when none is known
	Voters   []string // voting members' IDs
	Members  []string // every member's ID, voters first
	Applied  uint64   // the last log index applied here
	Healthy  bool     // autopilot's verdict, on the raft leader only
	Failures int      // autopilot's failure tolerance, on the raft leader only
}

// Status returns the member's view of its group.
func (n *Node) Status() Status {
	s := Status{ID: n.id, Addr: n.addr, State: n.raft.State().String(), Applied: n.raft.AppliedIndex()}
	laddr, lid := n.raft.LeaderWithID()
	s.Leader, s.LeaderAt = string(lid), string(laddr)
	if f := n.raft.GetConfiguration(); f.Error() == nil {
		var non []string
		for _, srv := range f.Configuration().Servers {
			if srv.Suffrage == hraft.Voter {
				s.Voters = append(s.Voters, string(srv.ID))
			} else {
				non = append(non, string(srv.ID))
			}
		}
		s.Members = append(append([]string{}, s.Voters...), non...)
	}
	if st := n.pilot.GetState(); st != nil && n.raft.State() == hraft.Leader {
		s.Healthy, s.Failures = st.Healthy, st.FailureTolerance
	}
	return s
}

// Close leaves the group gracefully: a raft leader first hands leadership
// to another voter (so the group does not wait an election timeout), then
// the member asks to be removed from the configuration (so that a group
// whose instances are replaced one by one keeps its quorum), then it stops.
// ctx bounds the goodbye; the member stops regardless. Close does not end
// Backends built on the Node: close them first.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	n.leave(ctx)
	return n.shutdown()
}

// kill stops the member at once, without leaving: as a crash would, but
// within the process. Tests and benchmarks use it (internal/testhook).
func (n *Node) kill() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	return n.shutdown()
}

func (n *Node) shutdown() error {
	// Each step is logged, so that a stop that hangs says where.
	step := func(s string) { n.log.Debug("member stopping", "step", s) }
	n.cancel()
	step("raft")
	// Under recoverMu: a recovery under way finishes its restart first,
	// and none starts after (closed is set).
	n.recoverMu.Lock()
	err := n.raft.Shutdown().Error()
	n.recoverMu.Unlock()
	step("autopilot")
	<-n.pilot.Stop()
	step("listeners")
	_ = n.http.Close()
	_ = n.mux.close()
	n.trans.Close()
	step("background work")
	n.wg.Wait()
	step("stores")
	n.rlog.close()
	n.client.close()
	for _, c := range n.stores {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	n.log.Debug("member stopped")
	return err
}

// leave hands leadership on and removes this member from the group.
func (n *Node) leave(ctx context.Context) {
	if n.onlyMember() {
		// Nobody to hand leadership to, and raft keeps at least one
		// voter: the group ends with this member. Trying would wait out
		// ctx for a leader other than this one.
		n.log.Info("last member of the group: nothing to hand on or leave")
		return
	}
	if n.raft.State() == hraft.Leader {
		n.handLeadershipOn()
	}
	if !n.inConfiguration() {
		return
	}
	for {
		if n.raft.State() == hraft.Leader {
			// Leadership came back: the transfer's target did not take
			// over in time and this member won the next election. A
			// leader cannot leave through itself, so hand it on again.
			n.handLeadershipOn()
		}
		err := n.forwardJSON(ctx, "/v1/raft/leave", joinRequest{ID: n.id, Addr: n.addr}, nil)
		if err == nil {
			n.log.Info("left the group")
			return
		}
		if ctx.Err() != nil {
			n.log.Warn("could not leave the group; autopilot removes this member later", "err", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// handLeadershipOn transfers raft leadership to another voter, so that
// this member can leave through the new leader.
func (n *Node) handLeadershipOn() {
	if err := n.await(n.raft.LeadershipTransfer()); err != nil {
		n.log.Warn("leadership transfer failed; the group elects a new leader after a timeout", "err", err)
	} else {
		n.log.Info("handed raft leadership on")
	}
}

// onlyMember reports whether this member is the only server in the
// group's configuration.
func (n *Node) onlyMember() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	servers := f.Configuration().Servers
	return len(servers) == 1 && string(servers[0].ID) == n.id
}

func (n *Node) inConfiguration() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == n.id {
			return string(s.Address) == n.addr
		}
	}
	return false
}

// Changed returns a channel that is closed at the next change of lease name
// in this member's copy of the log. With a stale Leader read after each
// change (Options.StaleReads), an observer follows a lease without polling.
func (n *Node) Changed(name string) <-chan struct{} {
	_, ch := n.fsm.lease(name, "")
	return ch
}
