package testserver

// Stop stops the server (fast shutdown) and keeps its data directory, so
// that Restart can start it again, with its data or wiped: a fault
// harness holds the server down for a while between the two.
func (p *Postgres) Stop() { p.stop() }
