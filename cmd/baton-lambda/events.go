package main

import (
	"encoding/json"
	"fmt"
	"slices"
)

// groupsOf returns the Auto Scaling groups that event asks to reconcile:
// the group an Auto Scaling notification names (through SNS, one per
// record) or an EventBridge Auto Scaling event names, or every configured
// group for a scheduled event. An event of another shape is an error: the
// invocation fails rather than do nothing silently.
func groupsOf(event []byte, configured []string) ([]string, error) {
	var e struct {
		Records []struct {
			EventSource string
			Sns         struct{ Message string }
		}
		Source     string          `json:"source"`
		DetailType string          `json:"detail-type"`
		Detail     json.RawMessage `json:"detail"`
	}
	if err := json.Unmarshal(event, &e); err != nil {
		return nil, fmt.Errorf("baton-lambda: the event is not JSON: %w", err)
	}
	var groups []string
	add := func(g string) {
		if g != "" && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	switch {
	case len(e.Records) > 0:
		for _, r := range e.Records {
			if r.EventSource != "aws:sns" {
				return nil, fmt.Errorf("baton-lambda: a record from %q: want Auto Scaling notifications through SNS", r.EventSource)
			}
			var m struct {
				AutoScalingGroupName string
				Event                string
			}
			if err := json.Unmarshal([]byte(r.Sns.Message), &m); err != nil {
				return nil, fmt.Errorf("baton-lambda: an SNS message that is not an Auto Scaling notification: %w", err)
			}
			if m.Event == "autoscaling:TEST_NOTIFICATION" {
				continue
			}
			if m.AutoScalingGroupName == "" {
				return nil, fmt.Errorf("baton-lambda: an SNS message that names no AutoScalingGroupName")
			}
			add(m.AutoScalingGroupName)
		}
	case e.Source == "aws.autoscaling":
		var d struct{ AutoScalingGroupName string }
		if err := json.Unmarshal(e.Detail, &d); err != nil || d.AutoScalingGroupName == "" {
			return nil, fmt.Errorf("baton-lambda: an EventBridge Auto Scaling event (%s) that names no AutoScalingGroupName", e.DetailType)
		}
		add(d.AutoScalingGroupName)
	case e.Source == "aws.events" || e.DetailType == "Scheduled Event":
		for _, g := range configured {
			add(g)
		}
	default:
		return nil, fmt.Errorf("baton-lambda: unknown event (source %q, detail-type %q): want an Auto Scaling notification through SNS, an EventBridge Auto Scaling event or a scheduled event", e.Source, e.DetailType)
	}
	if len(configured) > 0 {
		for _, g := range groups {
			if !slices.Contains(configured, g) {
				return nil, fmt.Errorf("baton-lambda: the event names group %q, which BATON_GROUPS does not list", g)
			}
		}
	}
	return groups, nil
}
