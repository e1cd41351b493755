package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// WritePath is the path a child POSTs its writes to.
const WritePath = "/v1/write"

// maxRequest bounds a request body: a write is under 200 bytes, so anything
// larger is not a write.
const maxRequest = 4 << 10

// maxCandidate bounds a candidate id, which the store keeps for every write.
const maxCandidate = 128

// Request is the body of a write: the child's identity and its term's token.
// Token is a decimal string, not a JSON number, so that a uint64 survives
// readers that hold numbers as float64.
type Request struct {
	// Candidate is the id of the `baton run` whose child writes ("c1").
	Candidate string `json:"candidate"`
	// Token is BATON_TOKEN of the child's term, in decimal.
	Token string `json:"token"`
	// PID is the child's process id.
	PID int `json:"pid"`
	// Seq counts the child's writes from 1.
	Seq int64 `json:"seq"`
}

// Response is the store's answer to a write that was well formed.
type Response struct {
	// Accepted reports whether the store took the write.
	Accepted bool `json:"accepted"`
	// Highest is the highest token the store has accepted, after this
	// write, in decimal.
	Highest string `json:"highest"`
}

// write is a parsed, valid Request.
type write struct {
	candidate string
	token     uint64
	pid       int
	seq       int64
}

// parseRequest decodes and validates a write's body. Its errors name the
// field at fault and what a valid value looks like, because they go back to
// the writer as a 400.
func parseRequest(body []byte) (write, error) {
	if len(body) > maxRequest {
		return write{}, fmt.Errorf("body is %d bytes; a write is a JSON object of at most %d", len(body), maxRequest)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var r struct {
		Candidate *string `json:"candidate"`
		Token     *string `json:"token"`
		PID       *int    `json:"pid"`
		Seq       *int64  `json:"seq"`
	}
	if err := dec.Decode(&r); err != nil {
		return write{}, fmt.Errorf(`body is not a write: %v; want {"candidate":"c1","token":"42","pid":1234,"seq":1}`, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return write{}, errors.New("body has more than one JSON value; send one write per request")
	}
	switch {
	case r.Token == nil:
		return write{}, errors.New(`missing "token": send the term's BATON_TOKEN as a decimal string, e.g. "token":"42"`)
	case r.Candidate == nil || *r.Candidate == "":
		return write{}, errors.New(`missing "candidate": send the id of the baton run whose child writes, e.g. "candidate":"c1"`)
	case len(*r.Candidate) > maxCandidate:
		return write{}, fmt.Errorf(`"candidate" is %d bytes; at most %d`, len(*r.Candidate), maxCandidate)
	case r.PID == nil || *r.PID <= 0 || *r.PID > math.MaxInt32:
		return write{}, errors.New(`missing or invalid "pid": send the child's process id (1 to 2^31-1)`)
	case r.Seq == nil || *r.Seq <= 0:
		return write{}, errors.New(`missing or non-positive "seq": number the child's writes from 1`)
	}
	tok, err := strconv.ParseUint(*r.Token, 10, 64)
	if err != nil {
		return write{}, fmt.Errorf(`"token" %q is not a decimal uint64 (BATON_TOKEN)`, *r.Token)
	}
	return write{candidate: *r.Candidate, token: tok, pid: *r.PID, seq: *r.Seq}, nil
}
