// Package discovery finds the addresses of the instances that may be members
// of a baton group, so that a new member of the embedded consensus backend
// knows whom to contact.
//
// # What is guaranteed, and what is not
//
//   - Every address a Discoverer returns is "host:port" with a non-zero port,
//     ready for net.Dial, and appears once.
//   - A Discoverer reports what its source says at the time of the call (or,
//     for a caching one, at most one cache lifetime earlier); it does not check that
//     anything listens at the addresses, and the list may include the caller.
//   - Different instances may see different lists at the same moment: Auto
//     Scaling and DNS are eventually consistent. Discovery therefore only
//     proposes candidates; it never decides membership. The consensus
//     protocol does, and must tolerate a list that is stale, partial or empty.
//   - A failed lookup is returned as an error, never hidden behind an old
//     answer.
//
// # Using it
//
// Parse turns a command-line or configuration string into a Discoverer:
//
//	static:10.0.0.1:7000,10.0.0.2,node-c.internal   (ports default to defaultPort)
//	dns:peers.example.com[:PORT]                       (A and AAAA records)
//	dns:_baton._tcp.example.com                        (SRV records: target and port)
//
// Static and DNS build the same Discoverers from Go values. Options.Schemes
// adds schemes built elsewhere: the members of an AWS Auto Scaling group,
// aws-asg[:GROUP], come from github.com/batonhq/baton/aws (aws.ASGScheme), a
// module of its own so that only programs that use it have the AWS SDK in
// their module graph. All Discoverers in this package are safe for
// concurrent use.
package discovery
