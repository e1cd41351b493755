// Package httpjson writes the JSON answers of baton's HTTP APIs (a raft
// member's API, the leader health check, the status API of `baton agent`
// and `baton run --http`) one way: indented, so that curl shows them
// readably, and never cached, since every answer is a moment's state.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Write writes v as indented JSON with status, uncached.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Error writes {"error": msg} with status.
func Error(w http.ResponseWriter, status int, msg string) {
	Write(w, status, ErrorBody{Error: msg})
}

// ErrorBody is the JSON of an error answer.
type ErrorBody struct {
	Error string `json:"error"`
	Lease string `json:"lease,omitempty"`
}
