// Package aws holds baton's AWS integrations, in a module of their own
// (github.com/batonhq/baton/aws) so that a program that does not use them
// does not have the AWS SDK in its module graph. It holds:
//
//   - the members of an EC2 Auto Scaling group as discovery peers (NewASG,
//     and ASGScheme for discovery.Parse's "aws-asg[:GROUP]" specs);
//   - the lifecycle of the instance a process runs on (NewInstance): the
//     notices that it is about to leave its group (Instance.Leaving: the
//     target lifecycle state Terminated, a spot interruption, optionally a
//     rebalance recommendation), whether it is in service
//     (Instance.InService), and its termination lifecycle hook
//     (Instance.Heartbeat, Instance.Complete);
//   - the group's membership for a raft group among its instances: the
//     members whose instance is leaving or gone (ASG.Departed) and how many
//     to wait for before forming one (ASG.BootstrapExpect);
//   - the leader tag (NewTagger, ParseTag): Tagger.Elected removes KEY from
//     the group's other instances, then tags this one with KEY and
//     KEY-token; Tagger.Demoted removes them;
//   - campaigns tied to the instance's lifecycle (NewGate): a gated
//     baton.Backend campaigns only while the instance is InService, its
//     terms ask to resign when the instance leaves InService, and each
//     term keeps the leader tag (GateOptions.Tagger) while it lasts;
//   - the group's own rule, with no lease (LeaderByRule): the InService,
//     Healthy instance with the lowest id;
//   - a raft group's secret where secrets live (SSMSecret: a Parameter
//     Store SecureString; SecretsManagerSecret: the AWSCURRENT, AWSPENDING
//     and AWSPREVIOUS versions of a secret), read through the instance's
//     role and again at each call, so that a rotation reaches running
//     members.
//
// # What is guaranteed, and what is not
//
//   - Every address an ASG returns is "host:port": an InService, Healthy
//     member's private IPv4 address with ASGOptions.Port, once each.
//   - An ASG reports what Auto Scaling said at most one cache lifetime
//     earlier. Auto Scaling is eventually consistent, so different instances
//     may see different lists at the same moment; discovery only proposes
//     candidates and never decides membership.
//   - NewASG reads the instance's identity with IMDSv2 only. If a session
//     token cannot be obtained it fails closed with ErrIdentity; it never
//     falls back to the unauthenticated IMDSv1.
//   - A failed refresh is returned as an error, never hidden behind an old
//     answer, unless ASGOptions.MaxStale explicitly allows a bounded one.
//   - An Instance reports only the notices EC2 publishes in IMDS, within
//     its poll interval; an instance lost without notice gives none, so a
//     hand-over on a notice shortens a failover but never replaces the
//     lease's own safety. InService turns false within the IMDS poll
//     interval when the target lifecycle state leaves InService (within
//     InstanceOptions.StateInterval where only Auto Scaling's own state
//     shows it), and true only once Auto Scaling reports the instance
//     InService. NewInstance, too, reads IMDS with IMDSv2 only.
//
// The AWS clients are reached through the small ASGAPI, EC2API, IMDSAPI,
// LifecycleAPI, InstanceIMDSAPI and TagAPI interfaces; ASGOptions and
// InstanceOptions can supply them. ASG and Instance are safe for
// concurrent use.
package aws
