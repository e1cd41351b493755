package dynamodb

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Policy returns the least-privilege IAM policy document (JSON) for a role
// that runs baton on the table of ARN tableARN
// (arn:aws:dynamodb:REGION:ACCOUNT:table/TABLE) for the given lease names,
// each a name or a pattern with * and ? (IAM's StringLike). It allows
// DescribeTable (New's check), GetItem, BatchGetItem (a waiter's polls)
// and UpdateItem on those leases' items and on session items, and PutItem on session items only, each
// limited by dynamodb:LeadingKeys. It allows no DeleteItem: a Backend never
// deletes an item, and a role that cannot is sure not to reset a token.
// A role limited to some leases can still mark any process's session
// dead, which a takeover needs; keep one table per trust domain.
func Policy(tableARN string, leases []string) (string, error) {
	if !strings.HasPrefix(tableARN, "arn:") || !strings.Contains(tableARN, ":table/") {
		return "", fmt.Errorf("table ARN %q: want arn:aws:dynamodb:REGION:ACCOUNT:table/TABLE", tableARN)
	}
	if len(leases) == 0 {
		return "", fmt.Errorf("no lease names: give the names (or patterns such as app-*) the role may hold")
	}
	keys := []string{SessionPrefix + "*"}
	for _, l := range leases {
		if l == "" || len(l) > MaxNameLen {
			return "", fmt.Errorf("lease name %q: want 1 to %d bytes", l, MaxNameLen)
		}
		keys = append(keys, LeasePrefix+l)
	}
	type statement struct {
		Sid       string
		Effect    string
		Action    []string
		Resource  string
		Condition map[string]map[string][]string `json:",omitempty"`
	}
	leading := func(keys []string) map[string]map[string][]string {
		return map[string]map[string][]string{"ForAllValues:StringLike": {"dynamodb:LeadingKeys": keys}}
	}
	doc := struct {
		Version   string
		Statement []statement
	}{
		Version: "2012-10-17",
		Statement: []statement{
			{Sid: "BatonCheckTable", Effect: "Allow", Action: []string{"dynamodb:DescribeTable"}, Resource: tableARN},
			{Sid: "BatonLeasesAndSessions", Effect: "Allow", Action: []string{"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:UpdateItem"}, Resource: tableARN, Condition: leading(keys)},
			{Sid: "BatonNewSessions", Effect: "Allow", Action: []string{"dynamodb:PutItem"}, Resource: tableARN, Condition: leading([]string{SessionPrefix + "*"})},
		},
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	return string(out) + "\n", err
}
