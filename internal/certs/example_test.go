package certs_test

import (
	"bufio"
	"crypto/tls"
	"fmt"

	"github.com/batonhq/baton/internal/certs"
)

// Two members of one group, made in memory as `baton demo` does, greet each
// other over mutual TLS on loopback.
func ExampleCA_Config() {
	ca, err := certs.NewCA("demo group CA", 0)
	if err != nil {
		panic(err)
	}
	serverCfg, err := ca.Config("node-1", []string{"127.0.0.1"})
	if err != nil {
		panic(err)
	}
	clientCfg, err := ca.Config("node-2", []string{"127.0.0.1"}, certs.VerifyPeerName(true))
	if err != nil {
		panic(err)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverCfg)
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		tc := conn.(*tls.Conn)
		if tc.Handshake() != nil {
			return
		}
		peer := tc.ConnectionState().PeerCertificates[0].Subject.CommonName
		fmt.Fprintf(conn, "hello %s, this is node-1\n", peer)
	}()

	conn, err := tls.Dial("tcp", ln.Addr().String(), clientCfg)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		panic(err)
	}
	fmt.Print(line)
	<-done
	// Output: hello node-2, this is node-1
}
