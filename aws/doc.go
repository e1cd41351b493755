// Package aws holds baton's AWS integrations, in a module of their own
// (github.com/batonhq/baton/aws) so that a program that does not use them
// does not have the AWS SDK in its module graph. Today it holds one: the
// members of an EC2 Auto Scaling group as discovery peers (NewASG, and
// ASGScheme for discovery.Parse's "aws-asg[:GROUP]" specs).
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
//
// The AWS clients are reached through the small ASGAPI, EC2API and IMDSAPI
// interfaces; ASGOptions can supply them. An ASG is safe for concurrent use.
package aws
