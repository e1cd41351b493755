package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeTestFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func assertMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s: mode %v, want %v", path, got, want)
	}
}

// assertFileError checks that err is a *FileError for field, of kind, whose
// message names the field, the file and contains phrase.
func assertFileError(t *testing.T, err error, field string, kind error, phrase string) *FileError {
	t.Helper()
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("got %v (%T), want a *FileError", err, err)
	}
	if fe.Field != field {
		t.Errorf("Field %q, want %q (%v)", fe.Field, field, err)
	}
	if !errors.Is(err, kind) {
		t.Errorf("errors.Is(err, %v) is false: %v", kind, err)
	}
	msg := err.Error()
	for _, want := range []string{field, fe.File, phrase, fe.Fix} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}
	if fe.Fix == "" {
		t.Errorf("no fix in %q", msg)
	}
	return fe
}

// pemFile writes PEM blocks of typ holding ders to dir/name.
func pemFile(t *testing.T, dir, name, typ string, ders ...[]byte) string {
	t.Helper()
	var data []byte
	for _, der := range ders {
		data = append(data, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})...)
	}
	path := filepath.Join(dir, name)
	writeTestFile(t, path, data)
	return path
}

func keyFile(t *testing.T, dir, name string, key crypto.Signer) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pemFile(t, dir, name, "PRIVATE KEY", der)
}

// expiredCACert makes a self-signed CA certificate that expired an hour ago.
func expiredCACert(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "old CA"},
		NotBefore:             time.Now().Add(-48 * time.Hour),
		NotAfter:              time.Now().Add(-time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestLoadErrors gives Load each kind of bad file and checks that each
// yields its own FileError, naming the field, the file and the fix.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "group CA")
	good := writeMember(t, dir, ca, "node-1", []string{"127.0.0.1"})
	other := writeMember(t, dir, newTestCA(t, "other CA"), "intruder", nil)

	crafted := func(name string, mutate func(*x509.Certificate)) Files {
		leaf, key := craftLeaf(t, ca, name, mutate)
		return Files{
			CA:   good.CA,
			Cert: pemFile(t, dir, name+".pem", "CERTIFICATE", leaf.Raw),
			Key:  keyFile(t, dir, name+"-key.pem", key),
		}
	}
	with := func(f Files, change func(*Files)) Files {
		change(&f)
		return f
	}
	certDER, _ := pem.Decode(mustRead(t, good.Cert))
	encrypted := filepath.Join(dir, "encrypted-key.pem")
	writeTestFile(t, encrypted, pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{0x30, 0}}))

	cases := []struct {
		name   string
		files  Files
		field  string
		kind   error
		phrase string
	}{
		{"CA not set", with(good, func(f *Files) { f.CA = "" }), FieldCA, ErrMissing, "CA file: not set"},
		{"CA missing", with(good, func(f *Files) { f.CA = filepath.Join(dir, "nope-ca.pem") }), FieldCA, ErrMissing, "does not exist"},
		{"certificate missing", with(good, func(f *Files) { f.Cert = filepath.Join(dir, "nope.pem") }), FieldCert, ErrMissing, "does not exist"},
		{"key missing", with(good, func(f *Files) { f.Key = filepath.Join(dir, "nope-key.pem") }), FieldKey, ErrMissing, "does not exist"},
		{"CA is a directory", with(good, func(f *Files) { f.CA = dir }), FieldCA, ErrUnreadable, "cannot be read"},
		{"certificate not PEM", with(good, func(f *Files) {
			f.Cert = filepath.Join(dir, "text.pem")
			writeTestFile(t, f.Cert, []byte("this is not a certificate\n"))
		}), FieldCert, ErrNotPEM, "is not PEM: it holds no -----BEGIN"},
		{"certificate is DER", with(good, func(f *Files) {
			f.Cert = filepath.Join(dir, "cert.der")
			writeTestFile(t, f.Cert, certDER.Bytes)
		}), FieldCert, ErrNotPEM, "binary DER"},
		{"key empty", with(good, func(f *Files) {
			f.Key = filepath.Join(dir, "empty-key.pem")
			writeTestFile(t, f.Key, nil)
		}), FieldKey, ErrNotPEM, "is empty"},
		{"certificate and key swapped", with(good, func(f *Files) { f.Cert, f.Key = f.Key, f.Cert }), FieldCert, ErrMalformed, "not swapped"},
		{"key encrypted", with(good, func(f *Files) { f.Key = encrypted }), FieldKey, ErrMalformed, "encrypted private key"},
		{"CA is a member certificate", with(good, func(f *Files) { f.CA = f.Cert }), FieldCA, ErrNotCA, "is not a CA certificate"},
		{"CA expired", with(good, func(f *Files) { f.CA = pemFile(t, dir, "old-ca.pem", "CERTIFICATE", expiredCACert(t)) }),
			FieldCA, ErrExpired, "the CA certificate expired at"},
		{"key does not match", with(good, func(f *Files) { f.Key = other.Key }), FieldKey, ErrKeyMismatch, "does not match certificate file"},
		{"certificate expired", crafted("expired", func(c *x509.Certificate) {
			c.NotBefore, c.NotAfter = time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour)
		}), FieldCert, ErrExpired, "the certificate expired at"},
		{"certificate not yet valid", crafted("future", func(c *x509.Certificate) {
			c.NotBefore = time.Now().Add(time.Hour)
		}), FieldCert, ErrNotYetValid, "is not valid until"},
		{"certificate from another CA", with(good, func(f *Files) { f.Cert, f.Key = other.Cert, other.Key }),
			FieldCert, ErrUntrusted, "is not signed by the CA in CA file"},
		{"certificate without ClientAuth", crafted("server-only", func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		}), FieldCert, ErrExtKeyUsage, "does not allow TLS client auth"},
		{"certificate without ServerAuth", crafted("client-only", func(c *x509.Certificate) {
			c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}), FieldCert, ErrExtKeyUsage, "does not allow TLS server auth"},
	}
	seen := map[string]string{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Load(tc.files)
			if err == nil {
				t.Fatalf("Load succeeded: %v", cfg)
			}
			t.Log(err)
			fe := assertFileError(t, err, tc.field, tc.kind, tc.phrase)
			if want := fieldPath(tc.files, tc.field); fe.File != want {
				t.Errorf("File %q, want %q", fe.File, want)
			}
			key := fe.Field + ": " + fe.Kind.Error() + ": " + fe.Problem
			if prev, dup := seen[key]; dup {
				t.Errorf("same field, kind and problem as case %q: %s", prev, key)
			}
			seen[key] = tc.name
		})
	}

	// The OS cause stays reachable.
	_, err := Load(cases[1].files)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: errors.Is(err, fs.ErrNotExist) is false: %v", err)
	}
	// A certificate without the extended key usage extension is unrestricted.
	if _, err := Load(crafted("no-eku", func(c *x509.Certificate) { c.ExtKeyUsage = nil })); err != nil {
		t.Errorf("certificate without extended key usage: %v", err)
	}
}

func fieldPath(f Files, field string) string {
	switch field {
	case FieldCA:
		return f.CA
	case FieldCert:
		return f.Cert
	case FieldKey:
		return f.Key
	}
	return ""
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestLoadCABundle checks that a CA file may hold two CAs, as during a CA
// rotation, so that members issued by either talk to each other.
func TestLoadCABundle(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := newTestCA(t, "old CA"), newTestCA(t, "new CA")
	bundle := append(oldCA.CertPEM(), newCA.CertPEM()...)
	load := func(ca *CA, name string) *tls.Config {
		f := writeMember(t, dir, ca, name, nil)
		writeTestFile(t, f.CA, bundle)
		cfg, err := Load(f)
		if err != nil {
			t.Fatalf("Load %s: %v", name, err)
		}
		return cfg
	}
	addr, results := serveOnce(t, "127.0.0.1", load(newCA, "node-1"))
	if _, err := exchange(addr, load(oldCA, "node-2")); err != nil {
		t.Fatalf("client: %v", err)
	}
	if res := <-results; res.err != nil {
		t.Fatalf("server: %v", res.err)
	}
}

func TestFileErrorMessage(t *testing.T) {
	err := &FileError{Field: FieldCert, File: "/etc/baton/node.pem", Kind: ErrMissing, Problem: "does not exist",
		Fix: "check the path", Err: &fs.PathError{Op: "open", Path: "/etc/baton/node.pem", Err: fs.ErrNotExist}}
	want := `certs: certificate file "/etc/baton/node.pem": does not exist (file does not exist); check the path`
	if got := err.Error(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if !errors.Is(err, ErrMissing) || !errors.Is(err, fs.ErrNotExist) {
		t.Error("FileError does not unwrap to both its kind and its cause")
	}
}
