package config

import (
	"errors"
	"io"
	"testing"

	"github.com/tablease/tablease/api"
)

func TestTheDevIssuerIsRefusedOutsideDevMode(t *testing.T) {
	if devIssuer != api.DevIssuer {
		t.Fatalf("devIssuer %q is not api.DevIssuer %q", devIssuer, api.DevIssuer)
	}
	_, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_JWT_ISSUER": devIssuer})), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_JWT_ISSUER" {
		t.Fatalf("Load = %v, want a TABLEASE_JWT_ISSUER error", err)
	}
	c, err := Load([]string{"--dev"}, env(nil), io.Discard)
	if err != nil || c.Issuer != devIssuer {
		t.Fatalf("dev mode: issuer %q, err %v", c.Issuer, err)
	}
}

func TestDevModeSignsLeaseTokensThatNoDeploymentAccepts(t *testing.T) {
	if defaultLeaseIssuer != api.DefaultLeaseIssuer {
		t.Fatalf("defaultLeaseIssuer %q is not api.DefaultLeaseIssuer %q", defaultLeaseIssuer, api.DefaultLeaseIssuer)
	}
	// Dev mode, even with a deployment's settings, signs lease tokens as the dev issuer.
	c, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "app"}), io.Discard)
	if err != nil || c.LeaseIssuer != devIssuer {
		t.Fatalf("dev mode: lease issuer %q, err %v; want %q", c.LeaseIssuer, err, devIssuer)
	}
	// ...and refuses to be told another one.
	_, err = Load([]string{"--dev"}, env(map[string]string{"TABLEASE_LEASE_ISSUER": "my-tablease"}), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_LEASE_ISSUER" {
		t.Fatalf("dev mode with TABLEASE_LEASE_ISSUER=my-tablease: %v, want a TABLEASE_LEASE_ISSUER error", err)
	}
	// A deployment never signs as the dev issuer.
	_, err = Load(nil, env(prodEnv(map[string]string{"TABLEASE_LEASE_ISSUER": devIssuer})), io.Discard)
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_LEASE_ISSUER" {
		t.Fatalf("a deployment with TABLEASE_LEASE_ISSUER=%s: %v, want a TABLEASE_LEASE_ISSUER error", devIssuer, err)
	}
	c, err = Load(nil, env(prodEnv(nil)), io.Discard)
	if err != nil || c.LeaseIssuer != api.DefaultLeaseIssuer {
		t.Fatalf("a deployment: lease issuer %q, err %v", c.LeaseIssuer, err)
	}
}
