// Package certs makes and loads the mutual-TLS material that baton members
// use to talk to each other in the embedded raft group.
//
// A *tls.Config made by Load or CA.Config serves as both a server and a
// client config, and in both roles speaks only TLS 1.3, requires the peer's
// chain to end at the group CA (never the system roots), and requires the
// peer's certificate to be valid now and to allow the role it plays
// (certificates from CA.Issue allow both). Load checks the local files first
// and reports a mistake as a *FileError naming the file and the fix.
//
// What a config does not do: by default it authenticates "a member of this
// group", not "the member at this address" (VerifyPeerName(true) opts into
// checking the dialed host, which needs ForPeer with tls.Client); it never
// checks revocation, so keep member certificates short-lived and the CA key
// off the members; it does not reload files. In the default mode the config
// sets InsecureSkipVerify and checks the chain in VerifyConnection: keep both
// fields as they are, and never copy InsecureSkipVerify without the
// VerifyConnection that goes with it.
//
// Make a CA once, in a directory that never ships with the instances, and
// issue each member a certificate, with a copy of the CA certificate:
//
//	ca, err := certs.NewCA("baton group CA", 0)              // 0: DefaultCAValidity
//	err = ca.WriteFiles("ca/ca.pem", "ca/ca-key.pem")
//	certPEM, keyPEM, err := ca.Issue("node-1", []string{"10.0.3.7"}, 0)
//	err = certs.WritePair("tls/node-1.pem", "tls/node-1-key.pem", certPEM, keyPEM)
//	err = ca.WriteCert("tls/ca.pem")
//
//	cfg, err := certs.Load(certs.Files{CA: "tls/ca.pem", Cert: "tls/node-1.pem", Key: "tls/node-1-key.pem"})
//
// A certificate alone does not admit a member to a group: it must also prove
// the group's secret (backend/raft). Tests and `baton demo` use
// ca.Config(name, hosts), straight from memory. Why peer names are not
// checked by default, and the rest of the argument, is in docs/tls.md.
package certs
