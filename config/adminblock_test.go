package config

import (
	"errors"
	"io"
	"testing"
	"time"
)

func TestAdminMaxBlock(t *testing.T) {
	c, err := Load([]string{"--dev"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminMaxBlock != time.Hour {
		t.Fatalf("the default maximum block is 1h, got %s", c.AdminMaxBlock)
	}
	c, err = Load([]string{"--dev", "--admin-max-block", "15m"}, env(map[string]string{"TABLEASE_ADMIN_MAX_BLOCK": "2h"}), io.Discard)
	if err != nil || c.AdminMaxBlock != 15*time.Minute {
		t.Fatalf("the flag wins over the variable: %s %v", c.AdminMaxBlock, err)
	}
	for _, bad := range []string{"0s", "500ms", "169h", "-1m", "forever"} {
		_, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_ADMIN_MAX_BLOCK": bad}), io.Discard)
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != "TABLEASE_ADMIN_MAX_BLOCK" {
			t.Errorf("TABLEASE_ADMIN_MAX_BLOCK=%s: err %v, want one naming the variable", bad, err)
		}
	}
}
