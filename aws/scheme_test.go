package aws

import (
	"errors"
	"strings"
	"testing"

	"github.com/batonhq/baton/discovery"
)

func TestParseASGScheme(t *testing.T) {
	opts := discovery.Options{Schemes: []discovery.Scheme{ASGScheme(ASGOptions{})}}
	tests := []struct {
		spec        string
		defaultPort int
		wantString  string
	}{
		{"aws-asg", 7000, "aws-asg"},
		{"aws-asg:my-group", 7000, "aws-asg:my-group"},
		{"  aws-asg  ", 7000, "aws-asg"},
		{"AWS-ASG:web", 7000, "aws-asg:web"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			d, err := discovery.Parse(tt.spec, tt.defaultPort, opts)
			if err != nil {
				t.Fatalf("Parse(%q, %d): %v", tt.spec, tt.defaultPort, err)
			}
			if d.String() != tt.wantString {
				t.Errorf("String = %q, want %q", d.String(), tt.wantString)
			}
			again, err := discovery.Parse(d.String(), tt.defaultPort, opts)
			if err != nil || again.String() != d.String() {
				t.Errorf("Parse(%q) = %v, %v; want the same Discoverer", d.String(), again, err)
			}
		})
	}
}

func TestParseASGOptions(t *testing.T) {
	opts := discovery.Options{Schemes: []discovery.Scheme{ASGScheme(ASGOptions{Port: 8000, Region: "eu-west-1"})}}
	d, err := discovery.Parse("aws-asg:web", 7000, opts)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := d.(*ASG)
	if !ok {
		t.Fatalf("Parse returned %T, want *ASG", d)
	}
	if a.opts.Port != 8000 || a.opts.GroupName != "web" || a.opts.Region != "eu-west-1" {
		t.Errorf("options = port %d group %q region %q; want the spec's group and the given port and region",
			a.opts.Port, a.opts.GroupName, a.opts.Region)
	}
}

func TestParseASGErrors(t *testing.T) {
	opts := discovery.Options{Schemes: []discovery.Scheme{ASGScheme(ASGOptions{})}}
	tests := []struct {
		spec        string
		defaultPort int
		wantText    []string
	}{
		{"consul:web", 7000, []string{`unknown scheme "consul"`, "static:HOST[:PORT]", "dns:NAME[:PORT]", "dns:_SERVICE._PROTO.NAME", "aws-asg[:GROUP]"}},
		{"10.0.0.1:7000", 7000, []string{`unknown scheme "10.0.0.1"`, "aws-asg"}},
		{"", 7000, []string{"empty spec", "aws-asg[:GROUP]"}},
		{"aws-asg", 0, []string{"Port 0 is out of range"}},
		{"aws-asg:", 7000, []string{"group name", "is empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			d, err := discovery.Parse(tt.spec, tt.defaultPort, opts)
			if err == nil {
				t.Fatalf("Parse(%q, %d) = %v, want an error", tt.spec, tt.defaultPort, d)
			}
			if !errors.Is(err, discovery.ErrInvalidSpec) {
				t.Errorf("error %v does not wrap ErrInvalidSpec", err)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}
