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
