package discovery

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestStatic(t *testing.T) {
	tests := []struct {
		name  string
		addrs []string
		want  []string
	}{
		{"one", []string{"10.0.0.1:7000"}, []string{"10.0.0.1:7000"}},
		{"order kept", []string{"b.internal:1", "a.internal:2", "10.0.0.3:3"}, []string{"b.internal:1", "a.internal:2", "10.0.0.3:3"}},
		{"duplicates dropped after the first", []string{"a:1", "b:1", "a:1", "A:1"}, []string{"a:1", "b:1"}},
		{"same host other port kept", []string{"a:1", "a:2"}, []string{"a:1", "a:2"}},
		{"IPv6 canonical", []string{"[::0001]:7000", "[::1]:7000"}, []string{"[::1]:7000"}},
		{"IPv4-mapped IPv6 as IPv4", []string{"[::ffff:10.0.0.1]:7000", "10.0.0.1:7000"}, []string{"10.0.0.1:7000"}},
		{"port leading zeros", []string{"a:007"}, []string{"a:7"}},
		{"trailing dot kept", []string{"a.example.:1"}, []string{"a.example.:1"}},
		{"underscore label", []string{"my_host.internal:1"}, []string{"my_host.internal:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Static(tt.addrs...)
			if err != nil {
				t.Fatalf("Static(%q): %v", tt.addrs, err)
			}
			got, err := d.Peers(context.Background())
			if err != nil {
				t.Fatalf("Peers: %v", err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Peers = %q, want %q", got, tt.want)
			}
			got[0] = "mutated"
			if again, _ := d.Peers(context.Background()); again[0] == "mutated" {
				t.Error("Peers returned the Discoverer's own slice")
			}
			if want := "static:" + strings.Join(tt.want, ","); d.String() != want {
				t.Errorf("String = %q, want %q", d.String(), want)
			}
		})
	}
}

func TestStaticErrors(t *testing.T) {
	tests := []struct {
		name     string
		addrs    []string
		wantText []string // each must appear in the error
	}{
		{"none", nil, []string{"at least one address"}},
		{"empty", []string{""}, []string{"empty address"}},
		{"no port", []string{"a.internal"}, []string{`"a.internal" has no port`}},
		{"bare IPv6 without port", []string{"::1"}, []string{`"::1" has no port`}},
		{"port zero", []string{"a:0"}, []string{"not a number in 1-65535"}},
		{"port too big", []string{"a:65536"}, []string{"not a number in 1-65535"}},
		{"port negative", []string{"a:-1"}, []string{"not a number"}},
		{"port name", []string{"a:http"}, []string{`port "http"`}},
		{"empty host", []string{":7000"}, []string{"empty host"}},
		{"IPv6 without brackets", []string{"::1:7000:x"}, []string{"IPv6 addresses go in brackets"}},
		{"bad IPv4", []string{"10.0.0.256:1"}, []string{"neither an IP address nor a name"}},
		{"bad char", []string{"a b:1"}, []string{`contains ' '`}},
		{"scheme", []string{"http://a:1"}, []string{"not host:port"}},
		{"label hyphen", []string{"-a:1"}, []string{"begins or ends with '-'"}},
		{"empty label", []string{"a..b:1"}, []string{"label of 0 characters"}},
		{"long label", []string{strings.Repeat("x", 64) + ":1"}, []string{"label of 64 characters"}},
		{"every problem reported", []string{"a:1", "b", "c:0"}, []string{`"b" has no port`, `"c:0"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Static(tt.addrs...)
			if err == nil {
				t.Fatalf("Static(%q) = %v, want an error", tt.addrs, d)
			}
			if !errors.Is(err, ErrInvalidAddress) {
				t.Errorf("error %v does not wrap ErrInvalidAddress", err)
			}
			for _, w := range tt.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		spec        string
		defaultPort int
		wantString  string
		wantPeers   []string // checked for static specs only: others need a server
	}{
		{"static:10.0.0.1:7000,10.0.0.2", 7946, "static:10.0.0.1:7000,10.0.0.2:7946", []string{"10.0.0.1:7000", "10.0.0.2:7946"}},
		{"static: a , b:1 ", 9, "static:a:9,b:1", []string{"a:9", "b:1"}},
		{"static:[::1],[::2]:80,::3", 7, "static:[::1]:7,[::2]:80,[::3]:7", []string{"[::1]:7", "[::2]:80", "[::3]:7"}},
		{"STATIC:a:1", 0, "static:a:1", []string{"a:1"}},
		{"static:a:1,a:1,b:2", 0, "static:a:1,b:2", []string{"a:1", "b:2"}},
		{"dns:peers.example.com", 7000, "dns:peers.example.com:7000", nil},
		{"dns:Peers.Example.com:80", 7000, "dns:peers.example.com:80", nil},
		{"dns:peers.example.com:80", 0, "dns:peers.example.com:80", nil},
		{"dns:_baton._tcp.example.com", 7000, "dns:_baton._tcp.example.com", nil},
		{"dns:_baton._tcp.example.com", 0, "dns:_baton._tcp.example.com", nil},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			d, err := Parse(tt.spec, tt.defaultPort, Options{})
			if err != nil {
				t.Fatalf("Parse(%q, %d): %v", tt.spec, tt.defaultPort, err)
			}
			if d.String() != tt.wantString {
				t.Errorf("String = %q, want %q", d.String(), tt.wantString)
			}
			if tt.wantPeers != nil {
				got, err := d.Peers(context.Background())
				if err != nil || !slices.Equal(got, tt.wantPeers) {
					t.Errorf("Peers = %q, %v; want %q", got, err, tt.wantPeers)
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		spec        string
		defaultPort int
		wantText    []string
	}{
		{"", 7000, []string{"empty spec", "static:HOST"}},
		{"   ", 7000, []string{"empty spec"}},
		{"consul:web", 7000, []string{`unknown scheme "consul"`, "static:HOST[:PORT]", "dns:NAME[:PORT]", "dns:_SERVICE._PROTO.NAME"}},
		{"aws-asg", 7000, []string{`unknown scheme "aws-asg"`}},
		{"peers.example.com", 7000, []string{`unknown scheme "peers.example.com"`}},
		{"static:", 7000, []string{"lists no address"}},
		{"static:a,,b", 7000, []string{"entry 2: empty address"}},
		{"static:a", 0, []string{`entry 1: "a" has no port`}},
		{"static:a:0,b:x", 7000, []string{"entry 1", "entry 2"}},
		{"dns:", 7000, []string{"names no DNS name"}},
		{"dns:peers.example.com", 0, []string{"needs a port"}},
		{"dns:peers.example.com:0", 7000, []string{"not a number in 1-65535"}},
		{"dns:peers.example.com:1:2", 7000, []string{`port "1:2"`}},
		{"dns:_baton._tcp.example.com:7000", 7000, []string{"takes its ports from its records"}},
		{"dns:bad name", 7000, []string{"contains ' '"}},
		{"static:a:1", -1, []string{"default port -1"}},
		{"static:a:1", 70000, []string{"default port 70000"}},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			d, err := Parse(tt.spec, tt.defaultPort, Options{})
			if err == nil {
				t.Fatalf("Parse(%q, %d) = %v, want an error", tt.spec, tt.defaultPort, d)
			}
			if !errors.Is(err, ErrInvalidSpec) {
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

// FuzzParse checks that Parse never panics, and that what it builds
// describes itself in a spec that Parse turns into the same thing.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"static:10.0.0.1:7000,10.0.0.2", "static:[::1]:80,::2", "dns:peers.example.com",
		"dns:peers.example.com:80", "dns:_baton._tcp.example.com", "aws-asg", "aws-asg:web",
		"", ":", "static:", "static:,", "dns::", "static:[", "static:[]:1", "static:a%:1",
		"static:[fe80::1%eth0]:7", "aws-asg:a:b", "dns:_x:1",
	} {
		f.Add(s, 7000)
	}
	f.Fuzz(func(t *testing.T, spec string, defaultPort int) {
		d, err := Parse(spec, defaultPort, Options{})
		if err != nil {
			if !errors.Is(err, ErrInvalidSpec) {
				t.Fatalf("Parse(%q, %d) error %v does not wrap ErrInvalidSpec", spec, defaultPort, err)
			}
			return
		}
		again, err := Parse(d.String(), defaultPort, Options{})
		if err != nil {
			t.Fatalf("Parse(%q) = %q, which Parse rejects: %v", spec, d.String(), err)
		}
		if again.String() != d.String() {
			t.Fatalf("Parse(%q) = %q, which Parse turns into %q", spec, d.String(), again.String())
		}
		if s, ok := d.(*static); ok {
			for _, a := range s.addrs {
				if _, err := Static(a); err != nil {
					t.Fatalf("Parse(%q) produced address %q that Static rejects: %v", spec, a, err)
				}
			}
		}
	})
}
