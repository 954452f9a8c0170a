package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/tablease/tablease/owner/leasetoken"
)

// keygen writes a new Ed25519 private key for lease tokens as PKCS#8 PEM (the format of
// TABLEASE_LEASE_SIGNING_KEY): to stdout, or to --out, created with mode 0600 and never over an
// existing file. --public-out also writes the public key, for TABLEASE_LEASE_PREVIOUS_KEYS of
// another deployment. The key id goes to stderr.
func (p Program) keygen(args []string) int {
	fs := flag.NewFlagSet("tablease keygen", flag.ContinueOnError)
	out := fs.String("out", "", "file to write the private key to (mode 0600; refused if it exists); default stdout")
	pubOut := fs.String("public-out", "", "file to write the public key to, for TABLEASE_LEASE_PREVIOUS_KEYS")
	if code, ok := p.parseFlags(fs, "tablease keygen", "usage: tablease keygen [--out lease-key.pem] [--public-out lease-key.pub.pem]", args); !ok {
		return code
	}
	key, err := leasetoken.GenerateKey()
	if err != nil {
		fmt.Fprintln(p.Stderr, "tablease keygen:", err)
		return 1
	}
	priv, err := key.MarshalPEM()
	if err != nil {
		fmt.Fprintln(p.Stderr, "tablease keygen:", err)
		return 1
	}
	pub, err := key.Public().MarshalPEM()
	if err != nil {
		fmt.Fprintln(p.Stderr, "tablease keygen:", err)
		return 1
	}
	// The public key first: when the private key cannot be written, the public one is removed, so
	// that a failed run leaves neither half and can be run again as it was.
	if *pubOut != "" {
		if err := writeNew(*pubOut, pub, 0o644); err != nil {
			fmt.Fprintln(p.Stderr, "tablease keygen:", err)
			return 1
		}
	}
	if *out == "" {
		_, err = p.Stdout.Write(priv)
	} else {
		err = writeNew(*out, priv, 0o600)
	}
	if err != nil {
		if *pubOut != "" {
			_ = os.Remove(*pubOut)
		}
		fmt.Fprintln(p.Stderr, "tablease keygen:", err)
		return 1
	}
	fmt.Fprintf(p.Stderr, "tablease keygen: Ed25519 lease-token key, kid %s\n", key.KeyID())
	return 0
}

// writeNew writes data to a file that must not exist yet, with mode perm.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
