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

const tlsLong = `Make the mutual-TLS material of a raft group.

Members of a group talk over TLS with mutual authentication: each presents a
certificate signed by the group's CA and accepts only peers whose certificate
is. Make the CA once, keep its key off the members if you can, and issue one
certificate per member (or per fleet image: certificates are checked against
the CA, not against the member's address, so one can follow an instance
across address changes).

  baton tls ca   --dir /etc/baton/tls               # ca.pem, ca-key.pem
  baton tls cert --dir /etc/baton/tls --name web-1  # web-1.pem, web-1-key.pem

Existing files are never overwritten. Exit statuses: 0 written; 1 could not
write; 2 bad flags.`

type tlsCommand struct {
	app      *App
	dir      string
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
		Short: "Make the group's CA (DIR/ca.pem and DIR/ca-key.pem)",
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, args []string) error { return c.runCA(cmd.Context()) }),
	}
	ca.Flags().StringVar(&c.dir, "dir", ".", "directory to write to")
	ca.Flags().DurationVar(&c.validFor, "valid-for", 10*365*24*time.Hour, "validity of the CA")
	cert := &cobra.Command{
		Use:   "cert --dir DIR --name NAME [--host IP,...]",
		Short: "Issue a member certificate from DIR/ca.pem and DIR/ca-key.pem",
		Args:  noArgs,
		RunE:  wrapRunE(func(cmd *cobra.Command, args []string) error { return c.runCert(cmd.Context()) }),
	}
	cert.Flags().StringVar(&c.dir, "dir", ".", "directory holding the CA, and to write to")
	cert.Flags().StringVar(&c.name, "name", "", "member name: the certificate's common name and file names (required)")
	cert.Flags().StringVar(&c.hosts, "host", "", "comma-separated IPs and DNS names to put in the certificate (optional: peers check the CA, not the name)")
	cert.Flags().DurationVar(&c.validFor, "valid-for", 365*24*time.Hour, "validity of the certificate")
	cmd.AddCommand(ca, cert)
	return cmd
}

func (c *tlsCommand) runCA(context.Context) error {
	if err := c.checkValidFor(); err != nil {
		return err
	}
	ca, err := certs.NewCA("baton group CA", c.validFor)
	if err != nil {
		return err
	}
	certFile, keyFile := filepath.Join(c.dir, "ca.pem"), filepath.Join(c.dir, "ca-key.pem")
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	if err := ca.WriteFiles(certFile, keyFile); err != nil {
		return err
	}
	fmt.Fprintf(c.app.stdout(), "wrote %s and %s (keep the key safe: whoever has it can admit members)\n", certFile, keyFile)
	return nil
}

func (c *tlsCommand) runCert(context.Context) error {
	if strings.TrimSpace(c.name) == "" || strings.ContainsAny(c.name, `/\`) {
		return usageErrorf("--name %q: give the member's name, e.g. --name web-1 (no slashes: it names the files)", c.name)
	}
	if err := c.checkValidFor(); err != nil {
		return err
	}
	ca, err := certs.LoadCA(filepath.Join(c.dir, "ca.pem"), filepath.Join(c.dir, "ca-key.pem"))
	if err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("%w (make the CA first: baton tls ca --dir %s)", err, c.dir)}
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
	certFile, keyFile := filepath.Join(c.dir, c.name+".pem"), filepath.Join(c.dir, c.name+"-key.pem")
	if err := certs.WritePair(certFile, keyFile, certPEM, keyPEM); err != nil {
		return err
	}
	fmt.Fprintf(c.app.stdout(), "wrote %s and %s; run the member with --tls-ca %s --tls-cert %s --tls-key %s\n",
		certFile, keyFile, filepath.Join(c.dir, "ca.pem"), certFile, keyFile)
	return nil
}

// checkValidFor refuses a validity that would make a certificate no peer
// accepts, before anything is written.
func (c *tlsCommand) checkValidFor() error {
	if c.validFor <= 0 {
		return usageErrorf("--valid-for %s: the validity must be positive, e.g. --valid-for 8760h (a year)", c.validFor)
	}
	return nil
}
