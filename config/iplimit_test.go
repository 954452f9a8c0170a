package config

import (
	"io"
	"testing"
)

func TestIPRateLimit(t *testing.T) {
	c, err := Load([]string{"--dev"}, env(nil), io.Discard)
	if err != nil || c.IPRateLimit != 10 {
		t.Fatalf("default: %v, %v", c.IPRateLimit, err)
	}
	c, err = Load([]string{"--dev", "--ip-rate-limit", "0"}, env(nil), io.Discard)
	if err != nil || c.IPRateLimit != 0 {
		t.Fatalf("0 turns it off: %v, %v", c.IPRateLimit, err)
	}
	for _, bad := range []string{"-1", "x", "1e7"} {
		if _, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_IP_RATE_LIMIT": bad}), io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
