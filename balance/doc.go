// Package balance runs many named leases in each instance of a service and
// spreads their leadership over the instances, so that no instance leads much
// more than its fair share: ceil(leases / instances).
//
// # What is guaranteed, and what is not
//
// Balance never weakens baton's safety model. Every lease is an ordinary
// baton lease: one holder at a time, fencing tokens that strictly increase,
// and a callback whose context ends at the term's safe-until deadline. This
// package only decides when an instance campaigns for a lease, whether it
// keeps one it has won, and when it gives one up; it never runs a callback
// without a live term.
//
// Liveness: every instance keeps a campaign open (or opens one after a short,
// load-dependent delay) for every lease it does not hold, so a lease whose
// holder dies or resigns is taken over as long as one instance can reach the
// backend, even one whose count of instances is wrong.
//
// The balance bound: let L be the number of leases and N the number of
// instances, lo = floor(L/N) and hi = ceil(L/N), the fair share. When N has
// been stable for about one TTL plus RefreshInterval, every instance runs the
// same set of leases and can reach the backend, the group converges to every
// instance leading lo or hi leases — within the promised bound of hi + 1 —
// and stays there. On the way, free leases go to the least loaded instances
// first (see Delay), so loads stay within about one lease of each other,
// and an instance that ends up above hi (a race between instances whose
// views differ by a refresh, or a share computed with an N that is about to
// change) gives its excess back after ShedAfter. The tests check this for 50
// leases over 5 and 6 instances, after a kill, with fewer leases than
// instances, and on etcd.
//
// What it rests on, and so what can bend it: every decision uses a view up to
// RefreshInterval old; instances must agree on the lease set (one running a
// different set is counted but takes no share of the others' leases); and
// while N changes the share is computed with the old N, so the bound holds
// only approximately for about one TTL plus ShedAfter after a crash.
//
// Not guaranteed: which instance leads which lease, or that a lease stays
// put: balancing moves leases (gracefully, see Shedding).
//
// # The algorithm
//
// Counting instances. The Backend interface has no listing, so instances count
// each other through presence leases: every instance holds exactly one member
// slot among the leases "<Group>.member-0" … "<Group>.member-<MaxMembers-1>",
// taking a free one when it starts (a random one among the four lowest free
// slots, so that instances starting together rarely collide). Every
// RefreshInterval each instance reads the holders of the slots with Leader;
// N is the number of distinct holders. The slot names contain no "/", which
// etcd and ZooKeeper reject.
//
// A crashed instance's slot must be freed for N to drop. Session backends
// (etcd, ZooKeeper, Consul, raft) delete it when the session expires; on
// record stores (package backend/cas) a lease is only taken over by a
// candidate that has watched it unrenewed for a full TTL. So each instance
// also campaigns for the slots of the next two members after its own in slot
// order, and resigns any slot it wins at once: a dead member's slot is freed
// one TTL after its last renewal. (When more than two members adjacent in
// slot order die together, the later ones take one more TTL per two.)
//
// Choosing whether to campaign. Each instance knows its own load k (leases
// it leads). For a lease it does not hold:
//
//   - k < lo: it campaigns at once, and accepts what it wins ("eager").
//   - k >= lo, and the lease has a live holder (a member of the group): it
//     keeps a campaign open as a standby, so that a dead holder is noticed,
//     but it does not accept a lease won this way: it resigns it at once
//     (without running the callback), so that an eager instance can take it.
//   - k >= lo, and the lease has been without a live holder (free, or held by
//     an ID that holds no member slot) for (k - lo + 1) × Delay: it campaigns
//     and accepts. The more an instance leads, the longer it waits, so the
//     least-loaded instances take free leases first.
//
// Each instance also reads the holder of every lease it does not hold every
// RefreshInterval, which tells it whether a lease is free and how many
// leases each member leads.
//
// Shedding. An instance leading more than hi leases, when the others have
// room below hi, gives up its excess; one leading more than lo while another
// member leads fewer than lo gives up one lease. It does so only after the
// condition has held for ShedAfter (hysteresis: a view that is briefly wrong
// while N changes moves nothing), newest lease first, gracefully: the
// callback's context is cancelled, Group waits for the callback to return,
// then resigns. A shed lease goes to an eager instance (below lo) if there
// is one, else to the least loaded of the others after its Delay, and in
// either case, races between views aside, to an instance at least two
// leases below the shedder. So the sum of squared loads falls with every
// move, and shedding stops once loads are within [lo, hi]. If a shed lease
// lands on an instance that was not less loaded (a view was stale, or a
// member cannot take leases), the instance waits twice as long before its
// next shed, up to 8 × ShedAfter, so the group cannot flap.
//
// # While N changes
//
//   - A new instance takes a slot and is counted by the others within one
//     RefreshInterval. It is eager for every lease until it reaches lo; the
//     others see themselves above the share and shed to it after ShedAfter.
//   - An instance whose Run returns resigns its leases (callbacks first), then
//     its slot: standbys and eager instances take the leases over at once.
//   - A crashed instance's leases are taken over after one TTL: by an eager
//     instance when there is one; otherwise a standby wins and resigns each,
//     and the least loaded instances take them after their Delay — so a
//     lease fails over after TTL + Delay (+ a refresh at worst) instead of
//     one TTL when every instance leads its share. Its slot is freed one TTL
//     after its last renewal and N drops at the next refresh; until then the
//     share is computed with the old N, which only makes instances more
//     reluctant, never less safe. An instance that took more than the new
//     share meanwhile sheds the excess after ShedAfter.
//   - The first instance of a group sees N = 1 and takes every lease; it
//     sheds them to the others as they join.
//
// # Cost in backend requests
//
// Per instance and RefreshInterval: one Leader request for each member slot
// up to eight past the highest occupied one (all MaxMembers on the first
// scan), and one for each lease the instance does not hold. Campaigns: one
// held member slot, up to two reaper campaigns on others' slots, and one open
// campaign per lease it does not hold — what one baton.Elector per lease would
// cost. When a lease changes hands, each standby may win and resign it once
// before an accepting instance takes it: at most N-1 extra acquire and release
// pairs per hand-over. Renewals are the backend's own: one per session on
// session backends, one per held lease on record stores.
//
// # Using it
//
//	g, err := balance.New(backend, balance.Config{Group: "reports"})
//	...
//	for _, name := range []string{"report-eu", "report-us", "report-ap"} {
//		g.Add(name, func(ctx context.Context, t baton.Term) error {
//			return runReport(ctx, t.Lease(), t.Token()) // stop when ctx ends
//		})
//	}
//	err = g.Run(ctx) // until ctx ends; resigns everything on the way out
package balance
