package config

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestStreamSettingsHaveDefaultsAndBounds(t *testing.T) {
	base := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	c, err := Load(nil, env(base), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.StreamsPerUser != 32 || c.StreamsPerInstance != 10000 || c.StreamKeepalive != 15*time.Second || c.TicketSecret != nil {
		t.Fatalf("stream defaults: %d %d %v %q", c.StreamsPerUser, c.StreamsPerInstance, c.StreamKeepalive, c.TicketSecret)
	}

	ticketSecret := strings.Repeat("t", 40)
	c, err = Load([]string{"--streams-per-user", "4", "--stream-keepalive", "5s"}, env(map[string]string{
		"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud",
		"TABLEASE_STREAMS_PER_INSTANCE": "500", "TABLEASE_TICKET_SECRET": ticketSecret,
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.StreamsPerUser != 4 || c.StreamsPerInstance != 500 || c.StreamKeepalive != 5*time.Second || string(c.TicketSecret) != ticketSecret {
		t.Fatalf("stream settings: %d %d %v", c.StreamsPerUser, c.StreamsPerInstance, c.StreamKeepalive)
	}

	cases := []struct{ name, key, value string }{
		{"no streams per user is refused", "TABLEASE_STREAMS_PER_USER", "0"},
		{"a fraction of streams is refused", "TABLEASE_STREAMS_PER_USER", "1.5"},
		{"too many streams per instance are refused", "TABLEASE_STREAMS_PER_INSTANCE", "10000001"},
		{"a negative number of streams is refused", "TABLEASE_STREAMS_PER_INSTANCE", "-1"},
		{"a keepalive under a second is refused", "TABLEASE_STREAM_KEEPALIVE", "500ms"},
		{"a keepalive that is not a duration is refused", "TABLEASE_STREAM_KEEPALIVE", "often"},
		{"a short ticket secret is refused", "TABLEASE_TICKET_SECRET", "short-ticket-secret"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			m[tc.key] = tc.value
			_, err := Load(nil, env(m), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tc.key {
				t.Fatalf("got %v, want an error naming %s", err, tc.key)
			}
			if tc.key == "TABLEASE_TICKET_SECRET" && strings.Contains(err.Error(), tc.value) {
				t.Fatalf("error leaks the secret: %q", err)
			}
		})
	}
}

func TestSocketSettingsHaveDefaultsAndBounds(t *testing.T) {
	base := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	c, err := Load(nil, env(base), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.SocketsPerUser != 32 || c.SocketsPerInstance != 10000 || c.SocketLinger != 0 {
		t.Fatalf("socket defaults: %d %d %s (the linger's is the api's, from the default TTL)", c.SocketsPerUser, c.SocketsPerInstance, c.SocketLinger)
	}
	c, err = Load([]string{"--sockets-per-user", "4"}, env(map[string]string{
		"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud",
		"TABLEASE_SOCKETS_PER_INSTANCE": "500", "TABLEASE_SOCKET_LINGER": "30s",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.SocketsPerUser != 4 || c.SocketsPerInstance != 500 || c.SocketLinger != 30*time.Second {
		t.Fatalf("socket settings: %d %d %s", c.SocketsPerUser, c.SocketsPerInstance, c.SocketLinger)
	}
	for _, tc := range []struct{ key, value string }{
		{"TABLEASE_SOCKETS_PER_USER", "0"}, {"TABLEASE_SOCKETS_PER_USER", "100001"},
		{"TABLEASE_SOCKETS_PER_INSTANCE", "-1"}, {"TABLEASE_SOCKETS_PER_INSTANCE", "many"},
		{"TABLEASE_SOCKET_LINGER", "0s"}, {"TABLEASE_SOCKET_LINGER", "2h"}, {"TABLEASE_SOCKET_LINGER", "20"},
	} {
		m := map[string]string{tc.key: tc.value}
		for k, v := range base {
			m[k] = v
		}
		var ce *Error
		if _, err := Load(nil, env(m), io.Discard); !errors.As(err, &ce) || ce.Var != tc.key {
			t.Errorf("%s=%s: %v, want a configuration error naming it", tc.key, tc.value, err)
		}
	}
}
