package leaseredis

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// TestARedissURLVerifiesTheServerAgainstItsCAFile checks ca_file (NewClient): a Redis serving TLS
// with a certificate of a private CA is reached, and the engine works over it, when the URL names
// the CA's file; without it the system's CAs refuse the certificate; skip_verify=true (go-redis's)
// verifies nothing; and a ca_file that cannot serve is refused before any client is made.
func TestARedissURLVerifiesTheServerAgainstItsCAFile(t *testing.T) {
	dir := t.TempDir()
	files := writePKI(t, dir)
	caFile := files.ca
	srv := redistest.StartTLS(t, files.cert, files.key)
	base := "rediss://" + srv.TLSAddr() + "/0"
	withCA := base + "?ca_file=" + url.QueryEscape(caFile)
	ping := func(u string) error {
		t.Helper()
		c, err := NewClient(u, 2*time.Second)
		if err != nil {
			t.Fatalf("NewClient(%s): %v", u, err)
		}
		defer c.Close()
		return c.Ping(t.Context()).Err()
	}

	if err := ping(withCA); err != nil {
		t.Fatalf("PING over TLS with ca_file: %v", err)
	}
	var unknown x509.UnknownAuthorityError
	if err := ping(base); err == nil || (!errors.As(err, &unknown) && !strings.Contains(err.Error(), "unknown authority")) {
		t.Errorf("PING over TLS without ca_file = %v, want the certificate refused (unknown authority)", err)
	}
	if err := ping(base + "?skip_verify=true"); err != nil {
		t.Errorf("PING over TLS with skip_verify=true: %v", err)
	}

	c, err := NewClient(withCA, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	acquireOver(t, c, "TLS")

	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, want string }{
		{"redis://" + srv.Addr() + "/0?ca_file=" + url.QueryEscape(caFile), "ca_file is for rediss:// only"},
		{base + "?ca_file=" + url.QueryEscape(filepath.Join(dir, "missing.pem")), "ca_file: open "},
		{base + "?ca_file=" + url.QueryEscape(notPEM), "holds no PEM certificate"},
	} {
		if err := CheckURL(tc.url); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckURL(%s) = %v, want an error with %q", tc.url, err, tc.want)
		}
	}
}

// TestARedissURLShowsTheClientCertificateOfItsCertAndKeyFiles checks cert_file and key_file
// (NewClient): a Redis that asks clients for a certificate (tls-auth-clients yes, its default)
// refuses a client without one, and serves, the engine included, one whose URL names the files;
// files that cannot serve are refused before any client is made.
func TestARedissURLShowsTheClientCertificateOfItsCertAndKeyFiles(t *testing.T) {
	dir := t.TempDir()
	files := writePKI(t, dir)
	srv := redistest.StartMutualTLS(t, files.cert, files.key, files.ca)
	withCA := "rediss://" + srv.TLSAddr() + "/0?ca_file=" + url.QueryEscape(files.ca)
	withCert := withCA + "&cert_file=" + url.QueryEscape(files.clientCert) + "&key_file=" + url.QueryEscape(files.clientKey)
	client := func(u string) *redis.Client {
		t.Helper()
		c, err := NewClient(u, 2*time.Second)
		if err != nil {
			t.Fatalf("NewClient(%s): %v", u, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*redis.Client)
	}
	if err := client(withCA).Ping(t.Context()).Err(); err == nil {
		t.Errorf("PING without a client certificate succeeded, want it refused")
	}
	c := client(withCert)
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING with cert_file and key_file: %v", err)
	}
	acquireOver(t, c, "TLS with a client certificate")

	for _, tc := range []struct{ url, want string }{
		{withCA + "&cert_file=" + url.QueryEscape(files.clientCert), "go together"},
		{withCA + "&key_file=" + url.QueryEscape(files.clientKey), "go together"},
		{"redis://" + srv.Addr() + "/0?cert_file=" + url.QueryEscape(files.clientCert) + "&key_file=" + url.QueryEscape(files.clientKey), "rediss:// only"},
		{withCA + "&cert_file=" + url.QueryEscape(filepath.Join(dir, "missing.pem")) + "&key_file=" + url.QueryEscape(files.clientKey), "cert_file and key_file: open "},
		{withCA + "&cert_file=" + url.QueryEscape(files.clientCert) + "&key_file=" + url.QueryEscape(files.key), "private key does not match"},
	} {
		if err := CheckURL(tc.url); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckURL(%s) = %v, want an error with %q", tc.url, err, tc.want)
		}
	}
}

// acquireOver checks that an engine on client c grants a lease; over names the way c reaches Redis.
func acquireOver(t *testing.T, c redis.UniversalClient, over string) {
	t.Helper()
	e, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if l := mustAcquire(t, e, alice, tabA, lease.ModeTry); !l.Held {
		t.Errorf("acquire over %s = %+v, want held", over, l)
	}
}

// pki is the PEM files writePKI writes: a CA certificate, a server certificate for 127.0.0.1 and
// its key, and a client certificate and its key, both signed by the CA.
type pki struct{ ca, cert, key, clientCert, clientKey string }

// writePKI writes the files of a pki in dir.
func writePKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tablease test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, kind string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// leaf writes a certificate of the CA for use, and its key, as name.pem and name.key.
	leaf := func(name string, serial int64, use x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{use}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", keyDER)
	}
	p := pki{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.cert, p.key = leaf("redis", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}
