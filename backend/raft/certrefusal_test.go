package raft

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/certs"
)

// A member whose TLS files are another CA's gives up with
// ErrCertificateRefused (the CLI's exit 2) instead of retrying forever,
// both when it trusts only its own CA (it refuses the group's
// certificates) and when it trusts the group's CA but presents a
// certificate of another (the group refuses it, with a TLS alert); and it
// never joins.
func TestOtherCAGivesUp(t *testing.T) {
	t.Parallel()
	g := newTestGroup(t, 3)
	other, err := certs.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		trustsOur bool
	}{{"another CA altogether", false}, {"a certificate of another CA", true}} {
		t.Run(tc.name, func(t *testing.T) {
			o := g.options(t)
			group := o.TLS
			if o.TLS, err = other.Config("member", []string{"127.0.0.1"}); err != nil {
				t.Fatal(err)
			}
			if tc.trustsOur {
				o.TLS.RootCAs, o.TLS.ClientCAs, o.TLS.VerifyConnection = group.RootCAs, group.ClientCAs, group.VerifyConnection
			}
			n := startOutsider(t, o)
			select {
			case <-n.Failed():
			case <-time.After(60 * time.Second):
				t.Fatalf("the member of another CA did not give up: %+v", n.Status())
			}
			if !errors.Is(n.Err(), ErrCertificateRefused) {
				t.Fatalf("Err() = %v, want ErrCertificateRefused", n.Err())
			}
			t.Logf("%v", n.Err())
			select {
			case <-n.Joined():
				t.Fatal("the member of another CA joined")
			default:
			}
		})
	}
}

// A member in the secret-only mode (no TLS files) beside a CA-mode group
// holds the group's secret, but its self-signed certificate is no CA's:
// every member refuses it in the TLS handshake, before any secret is
// proved. It gives up with ErrCertificateRefused, as a member of another
// CA does, instead of retrying forever.
func TestSecretOnlyMemberOfCAGroupGivesUp(t *testing.T) {
	t.Parallel()
	g := newTestGroup(t, 3)
	o := g.options(t)
	o.TLS = nil
	n := startOutsider(t, o)
	select {
	case <-n.Failed():
	case <-time.After(60 * time.Second):
		t.Fatalf("the secret-only member beside a CA-mode group did not give up: %+v", n.Status())
	}
	if !errors.Is(n.Err(), ErrCertificateRefused) {
		t.Fatalf("Err() = %v, want ErrCertificateRefused", n.Err())
	}
	t.Logf("%v", n.Err())
	select {
	case <-n.Joined():
		t.Fatal("the secret-only member joined the CA-mode group")
	default:
	}
}
