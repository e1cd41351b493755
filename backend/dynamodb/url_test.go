package dynamodb_test

import (
	"strings"
	"testing"
	"time"

	batondynamodb "github.com/batonhq/baton/backend/dynamodb"
)

func TestParseURL(t *testing.T) {
	u, err := batondynamodb.ParseURL("dynamodb://baton-leases?region=eu-west-1&profile=prod&endpoint=http%3A%2F%2F127.0.0.1%3A8000&poll=2s")
	if err != nil {
		t.Fatal(err)
	}
	want := batondynamodb.URL{Table: "baton-leases", Region: "eu-west-1", Profile: "prod", Endpoint: "http://127.0.0.1:8000", Poll: 2 * time.Second}
	if u != want {
		t.Errorf("ParseURL = %+v; want %+v", u, want)
	}
	for raw, wantErr := range map[string]string{
		"dynamodb://ab":                           "3 to 255",
		"dynamodb://bad!name":                     "may hold only",
		"dynamodb://t:8000":                       "?endpoint=",
		"dynamodb://k:s@table":                    "credentials do not go in the URL",
		"dynamodb://table/x":                      "unexpected path",
		"dynamodb:table":                          "has no //",
		"dynamo://table":                          "scheme",
		"dynamodb://table?poll=-1s":               "positive duration",
		"dynamodb://table?region=a&region=b":      "given 2 times",
		"dynamodb://table?endpoint=ftp%3A%2F%2Fx": "http:// or https://",
		"dynamodb://table?x=1":                    `unknown parameter "x"`,
	} {
		_, err := batondynamodb.ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), wantErr) || !strings.Contains(err.Error(), "dynamodb://TABLE") {
			t.Errorf("ParseURL(%q) = %v; want an error naming %q and the form", raw, err, wantErr)
		}
	}
}

// FuzzParseURL: no input panics; an accepted URL names a valid table, and
// a rejected one's error shows the form.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"dynamodb://baton-leases", "dynamodb://t.b_c?region=eu-west-1&poll=1s", "dynamodb://%zz", "dynamodb://k:s@t?endpoint=http://[::1]:8000",
		"DYNAMODB://Table?profile=p", "dynamodb:///x", "dynamodb://table#f", "dynamodb://table?endpoint=http%3A%2F%2Fh"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := batondynamodb.ParseURL(raw)
		if err != nil {
			if !strings.Contains(err.Error(), batondynamodb.URLForm) {
				t.Errorf("ParseURL(%q): error %q does not show the form", raw, err)
			}
			return
		}
		if err := batondynamodb.CheckTableName(u.Table); err != nil {
			t.Errorf("ParseURL(%q) accepted table %q: %v", raw, u.Table, err)
		}
	})
}
