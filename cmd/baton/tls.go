package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/certs"
	"github.com/spf13/cobra"
)

const tlsLong = `Make the mutual-TLS material of a raft group that uses CA mode.

The group's secret alone is enough for a raft group: without --tls-* flags
each member makes its own key and certificate at start, and proves the
secret on every connection. In CA mode (--tls-ca, --tls-cert, --tls-key)
members also present a certificate signed by the group's CA and accept only
peers whose certificate is, and then prove the group's secret (BATON_SECRET)
all the same; they re-read the files every --reload-every, so that renewed
certificates and a new CA need no restart. Make the CA once, in a
directory of its own that never ships with the instances (its key can admit
members), and issue one certificate per member (or per fleet image:
certificates are checked against the CA, not against the member's address,
so one can follow an instance across address changes) into the directory
that does ship:

  baton tls ca   --dir ca                          # ca/ca.pem, ca/ca-key.pem: keep ca/ off the instances
  baton tls cert --ca-dir ca --dir tls --name web  # tls/web.pem, tls/web-key.pem, tls/ca.pem: ship tls/

tls cert copies the CA certificate (never its key) beside the member's files,
and refuses a --dir that holds the CA key. Existing files are never
overwritten. Exit statuses: 0 written; 1 could not write; 2 bad flags.`

type tlsCommand struct {
	app      *App
	dir      string
	caDir    string
	name     string
	hosts    string
	validFor time.Duration
}

func (a *App) newTLSCommand() *cobra.Command {
	c := &tlsCommand{app: a}
	cmd := &cobra.Command{
		Use:   "tls",
		Short: "Make a group CA and member certificates for raft://",
		Long:  tlsLong,
		Args:  noArgs,
	}
	ca := &cobra.Command{
		Use:   "ca --dir DIR",
		Short: "Make the group's CA (DIR/ca.pem and DIR/ca-key.pem); keep DIR off the instances",
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, args []string) error { return c.runCA(cmd.Context()) }),
	}
	ca.Flags().StringVar(&c.dir, "dir", ".", "directory to write the CA to (made with mode 0700: it holds the CA key)")
	ca.Flags().DurationVar(&c.validFor, "valid-for", 10*365*24*time.Hour, "validity of the CA")
	cert := &cobra.Command{
		Use:   "cert --ca-dir CADIR --dir DIR --name NAME [--host IP,...]",
		Short: "Issue a member certificate into DIR (NAME.pem, NAME-key.pem, ca.pem) from the CA in CADIR",
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, args []string) error { return c.runCert(cmd.Context()) }),
	}
	cert.Flags().StringVar(&c.caDir, "ca-dir", "", "directory holding ca.pem and ca-key.pem, made by baton tls ca (required)")
	cert.Flags().StringVar(&c.dir, "dir", ".", "directory to write the member's files to, which ships with the instance; it must not hold the CA key")
	cert.Flags().StringVar(&c.name, "name", "", "member name: the certificate's common name and file names (required)")
	cert.Flags().StringVar(&c.hosts, "host", "", "comma-separated IPs and DNS names to put in the certificate (optional: peers check the CA, not the name)")
	cert.Flags().DurationVar(&c.validFor, "valid-for", 365*24*time.Hour, "validity of the certificate")
	cmd.AddCommand(ca, cert)
	return cmd
}

func (c *tlsCommand) runCA(context.Context) error {
	if c.validFor <= 0 {
		return usageErrorf("%s", validForProblem(c.validFor))
	}
	ca, err := certs.NewCA("baton group CA", c.validFor)
	if err != nil {
		return err
	}
	certFile, keyFile := filepath.Join(c.dir, caFile), filepath.Join(c.dir, caKeyFile)
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		return err
	}
	fmt.Fprintf(c.app.stdout(), "wrote %s and %s (keep %s off the instances: whoever has the key can admit members); next: baton tls cert --ca-dir %s --dir DIR --name NAME\n",
		certFile, keyFile, c.dir, c.dir)
	return nil
}

const (
	caFile    = "ca.pem"
	caKeyFile = "ca-key.pem"
)

func (c *tlsCommand) runCert(context.Context) error {
	var problems []string
	if strings.TrimSpace(c.name) == "" || strings.ContainsAny(c.name, `/\`) {
		problems = append(problems, fmt.Sprintf("--name %q: give the member's name, e.g. --name web-1 (no slashes: it names the files)", c.name))
	}
	if c.caDir == "" {
		problems = append(problems, "--ca-dir is required: the directory made by `baton tls ca`, which holds the CA key and stays off the instances; --dir is where the member's files go")
	}
	if c.validFor <= 0 {
		problems = append(problems, validForProblem(c.validFor))
	}
	if len(problems) > 0 {
		return usageErrorf("%s", strings.Join(problems, "\n"))
	}
	if sameDir(c.caDir, c.dir) {
		return usageErrorf("--dir %s is the CA's directory (--ca-dir %s): the member's files ship with the instance and the CA key must not; give another --dir", c.dir, c.caDir)
	}
	if _, err := os.Stat(filepath.Join(c.dir, caKeyFile)); err == nil {
		return usageErrorf("--dir %s holds %s, a CA key, and its files ship with the instance: give a directory without it (move the CA to its own --ca-dir)", c.dir, caKeyFile)
	}
	ca, err := certs.LoadCA(filepath.Join(c.caDir, caFile), filepath.Join(c.caDir, caKeyFile))
	if err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("%w (make the CA first: baton tls ca --dir %s)", err, c.caDir)}
	}
	var hosts []string
	for h := range strings.SplitSeq(c.hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	certPEM, keyPEM, err := ca.Issue(c.name, hosts, c.validFor)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	certFile, keyFile, caCopy := filepath.Join(c.dir, c.name+".pem"), filepath.Join(c.dir, c.name+"-key.pem"), filepath.Join(c.dir, caFile)
	// The CA certificate first: a different CA's file in the way stops
	// everything before the member's key is written.
	if err := ca.WriteCert(caCopy); err != nil {
		return err
	}
	if err := certs.WritePair(certFile, keyFile, certPEM, keyPEM); err != nil {
		return err
	}
	fmt.Fprintf(c.app.stdout(), "wrote %s and %s, and the CA certificate %s (no key); ship %s and run the member with --tls-ca %s --tls-cert %s --tls-key %s\n",
		certFile, keyFile, caCopy, c.dir, caCopy, certFile, keyFile)
	return nil
}

// sameDir reports whether a and b name the same directory; paths that do
// not exist yet are compared by their cleaned absolute form.
func sameDir(a, b string) bool {
	if ai, err := os.Stat(a); err == nil {
		if bi, err := os.Stat(b); err == nil {
			return os.SameFile(ai, bi)
		}
	}
	aa, err1 := filepath.Abs(a)
	ba, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == ba
}

// validForProblem says why a --valid-for that is not positive is refused:
// it would make a certificate that no peer accepts.
func validForProblem(d time.Duration) string {
	return fmt.Sprintf("--valid-for %s: the validity must be positive, e.g. --valid-for 8760h (a year)", d)
}
