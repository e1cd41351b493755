// Package dynamodb is a baton backend on an Amazon DynamoDB table, through
// aws-sdk-go-v2. It is a module of its own, so that only programs that use
// it have the AWS SDK in their module graph.
//
// # What it guarantees, and what not
//
// A lease is an item of the table; so is each process's session. The
// guarantees are those of every baton record store (package backend):
//
//   - One holder at a time. Every acquisition is a conditional UpdateItem
//     on the token read before, and the token only ever grows by an ADD:
//     nothing sets, resets or deletes it. A Backend never deletes a lease's
//     item (a release removes the holder and keeps the token), so tokens
//     strictly increase across the terms of a lease. An item created
//     afresh starts its token at epoch<<32 + 1 (package backend, "Epoch
//     tokens"), so tokens keep rising when the table is dropped and made
//     again, if the creating candidate's clock reads a later second.
//   - Liveness rests on the holder's session item, not on clocks: a
//     contender takes a lease over only after it has seen the session's
//     renewal count unchanged for a full TTL on its own monotonic clock,
//     and then first marks the session dead on the condition that the
//     count is still the one it saw, so that no renewal can land after the
//     takeover. The holder's term ends at its last confirmed renewal's send
//     time + TTL − DriftMargin on its own monotonic clock, even when
//     DynamoDB cannot be reached. Wall clocks are never compared.
//   - An acquisition whose reply was lost (or whose retry by the SDK found
//     its own first attempt landed) is recognised by reading the item back:
//     it names this candidate, this session and the token written. It is
//     adopted, never mistaken for a loss. A renewal's lost reply costs
//     nothing: the count only grows, and the next renewal confirms.
//   - One write per process per RenewInterval, however many leases it
//     holds: the renewal of its session item. Waiters poll (DynamoDB pushes
//     nothing cheaply) every Options.PollInterval, two strongly consistent
//     reads a poll; docs/backends/dynamodb.md has the cost in request units
//     and dollars.
//
// Not guaranteed: Leader may name a holder that died, until a campaigning
// contender has seen its session unrenewed for a TTL. A process paused
// between its check and its write can still write after its term ended:
// only the token, checked by the store that takes the write (a
// ConditionExpression on the token, say), stops that.
//
// # The table
//
// One table, on-demand, with a string partition key "pk" (KeyAttribute)
// and nothing else; Time to Live on "expires" lets DynamoDB delete the
// items of sessions an hour after their last renewal. CreateTable makes
// it; so does `baton dynamodb create-table`, and the CloudFormation and
// Terraform of docs/backends/dynamodb.md, which also has the
// least-privilege IAM policy (dynamodb:LeadingKeys on "lease:NAME" and
// "session:*").
package dynamodb
