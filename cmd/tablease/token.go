package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/lease"
)

// tokenUsage is the first lines of token's --help.
const tokenUsage = `usage: tablease token --sub <user> [flags]

Mints an HS256 access token with the secret of TABLEASE_JWT_HS256_SECRET (required), whose iss
and aud are TABLEASE_JWT_ISSUER and TABLEASE_JWT_AUDIENCE, or, when they are unset, those of dev
mode (tablease-dev, tablease), which only a dev-mode server accepts.`

// token mints an HS256 access token from TABLEASE_JWT_HS256_SECRET, for development and scripts.
func (p Program) token(args []string) int {
	fs := flag.NewFlagSet("tablease token", flag.ContinueOnError)
	sub := fs.String("sub", "", "the user (required)")
	scope := fs.String("scope", "", "space- or comma-separated scopes, e.g. lease:admin")
	sid := fs.String("sid", "", "comma-separated session ids the token is limited to (default: every session)")
	ttl := fs.Duration("ttl", time.Hour, "lifetime of the token")
	if code, ok := p.parseFlags(fs, "tablease token", tokenUsage, args); !ok {
		return code
	}
	if err := lease.ValidateID("sub", *sub); err != nil {
		fmt.Fprintln(p.Stderr, "tablease token: --sub:", err)
		return 2
	}
	if *ttl < time.Second || *ttl > 30*24*time.Hour {
		fmt.Fprintln(p.Stderr, "tablease token: --ttl must be between 1s and 720h")
		return 2
	}
	// Trimmed as the server trims every variable, so that both sign with the same secret.
	secret := strings.TrimSpace(p.Getenv("TABLEASE_JWT_HS256_SECRET"))
	if len(secret) < 32 {
		fmt.Fprintln(p.Stderr, "tablease token: TABLEASE_JWT_HS256_SECRET must be set to the server's secret (at least 32 bytes)")
		return 2
	}
	cfg := api.AuthConfig{HS256Secret: []byte(secret), Issuer: strings.TrimSpace(p.Getenv("TABLEASE_JWT_ISSUER")),
		Audience: strings.TrimSpace(p.Getenv("TABLEASE_JWT_AUDIENCE"))}
	if cfg.Issuer == "" {
		cfg.Issuer = api.DevIssuer
	}
	if cfg.Audience == "" {
		cfg.Audience = "tablease"
	}
	spec := api.TokenSpec{Sub: *sub, Scopes: splitList(*scope), TTL: *ttl}
	sidGiven := false // --sid "" limits to no session, which is refused, not read as no --sid
	fs.Visit(func(f *flag.Flag) { sidGiven = sidGiven || f.Name == "sid" })
	if sidGiven {
		sessions, err := sessionList(*sid)
		if err != nil {
			fmt.Fprintln(p.Stderr, "tablease token: --sid:", err)
			return 2
		}
		spec.Sessions = sessions
	}
	tok, err := api.IssueToken(cfg, spec)
	if err != nil {
		fmt.Fprintln(p.Stderr, "tablease token:", err)
		return 1
	}
	fmt.Fprintln(p.Stdout, tok)
	return 0
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}

// sessionList reads --sid: session ids separated by commas, with spaces around them. An empty
// item or a list of none is refused rather than skipped: a token with no session left would have
// no sid claim, and so be good for every session (and, with lease:admin, for the admin routes).
func sessionList(s string) ([]string, error) {
	var out []string
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("%q has an empty item: give session ids separated by commas, or no --sid for a token good for every session", s)
		}
		var inv *lease.InvalidError
		if err := lease.ValidateID("sessionId", item); errors.As(err, &inv) {
			return nil, fmt.Errorf("%q is not a session id: it %s", item, inv.Reason)
		}
		out = append(out, item)
	}
	return out, nil
}
