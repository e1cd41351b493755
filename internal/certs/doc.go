// Package certs makes and loads the mutual-TLS material that baton members
// use to talk to each other in the embedded raft group.
//
// # What is guaranteed, and what is not
//
// A *tls.Config made by Load or CA.Config serves as both a server and a
// client config, and in both roles:
//
//   - Only TLS 1.3 is spoken.
//   - The peer must present a certificate chain that ends at a certificate in
//     the group CA file (or, for CA.Config, at that CA). The system roots are
//     never consulted, so a certificate from a public CA is refused.
//   - The peer's certificate must be within its validity period, and must
//     allow the role the peer plays: TLS server auth when it accepts the
//     connection, TLS client auth when it dials. Certificates made by
//     CA.Issue allow both, because every member is both.
//
// Load also checks the local material before any connection is made, so a
// mistake shows up at start-up as a *FileError naming the file and the fix,
// instead of as a handshake failure on some other host later.
//
// What a config does not do:
//
//   - By default it authenticates "a member of this group", not "the member
//     at this address": a client accepts any server certificate issued by the
//     group CA, whatever address it dialed. See "Peer names" below.
//   - It never checks revocation (there are no CRLs or OCSP). A member
//     certificate whose key leaks is trusted until it expires or the group
//     moves to a new CA, which is why member certificates should be short
//     lived and the CA key kept off the members where possible.
//   - It does not reload files. Load reads them once; to rotate certificates,
//     build a new config (and, for a server, a new listener) from the new files.
//     A certificate that expires while the process runs makes later handshakes
//     fail with crypto/x509's expiry error.
//
// # Peer names
//
// Members dial each other by IP address, and under Auto Scaling the set of
// member addresses changes all the time. Checking that the server's
// certificate names the dialed address (as HTTPS does) stops a holder of one
// member's key from impersonating a different member to a client whose
// traffic it can intercept; but it requires every certificate to list its
// member's current IPs, so certificates must be issued when an instance
// boots, by something that can reach the CA key. Baton's members are equally
// trusted and hold the same kind of credentials, so impersonating one
// particular member buys an attacker who already stole a member's key little
// that the stolen key did not give it anyway. The default therefore follows
// Consul's verify_server_hostname=false: verify the chain against the group
// CA and the extended key usage, not the name. This lets one certificate
// follow an instance across address changes, and lets a fleet be issued
// certificates by name alone.
//
// VerifyPeerName(true) opts into the stricter check: the client also requires
// the server certificate to carry a subject alternative name (IP address or
// DNS name) matching the host it dialed. Issue puts IP addresses in
// IPAddresses and everything else in DNSNames, so a member issued for
// "10.0.3.7" (or "127.0.0.1" in a test, or a network namespace's address)
// passes when dialed at that address. The dialed host comes from
// tls.Config.ServerName: tls.Dial and tls.DialWithDialer fill it in from the
// address, but with tls.Client the caller must set it on a clone of the
// config, as ForPeer(cfg, addr) does, or the handshake fails closed with
// crypto/tls's "either ServerName or InsecureSkipVerify must be specified".
//
// In the default mode the config sets InsecureSkipVerify and does the chain
// check itself in VerifyConnection; callers must keep both fields as they
// are. Do not copy InsecureSkipVerify into a config of your own without the
// VerifyConnection that goes with it.
//
// # Using it
//
// Make a CA once, in a directory of its own that never ships with the
// instances, and issue each member a certificate into the directory that
// does ship, with a copy of the CA certificate (WriteCert writes it without
// the key):
//
//	ca, err := certs.NewCA("baton group CA", 0)              // 0: DefaultCAValidity
//	err = ca.WriteFiles("ca/ca.pem", "ca/ca-key.pem")
//	certPEM, keyPEM, err := ca.Issue("node-1", []string{"10.0.3.7"}, 0)
//	err = certs.WritePair("tls/node-1.pem", "tls/node-1-key.pem", certPEM, keyPEM)
//	err = ca.WriteCert("tls/ca.pem")
//
// Each member gets tls/: the CA certificate, its certificate and its key,
// never ca-key.pem. A certificate alone does not admit a member to a baton
// group: it must also prove the group's secret (backend/raft).
//
//	cfg, err := certs.Load(certs.Files{CA: "tls/ca.pem", Cert: "tls/node-1.pem", Key: "tls/node-1-key.pem"})
//	ln, err := tls.Listen("tcp", ":7946", cfg)                          // serving
//	conn, err := tls.DialWithDialer(d, "tcp", "10.0.3.8:7946", cfg)     // dialing
//
// Tests and `baton demo` skip the files: ca.Config(name, hosts) returns the
// same kind of config straight from memory.
package certs
