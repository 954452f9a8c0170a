package leasetoken

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/lease"
)

// FuzzPayloadIsWhatEncodingJSONWrites holds appendPayload to what encoding/json writes of the
// same claims (wireClaims), for every issuer and every claims Sign accepts.
func FuzzPayloadIsWhatEncodingJSONWrites(f *testing.F) {
	f.Add("https://tablease.example", "u-1", "s:1", "t-Xk3_9aQz-Lm0PqR7sTuVwY", int64(1767225600), int64(45), int64(1767225600000000))
	f.Add(`iss "<&>" \ é`+"\u2028\x01", "a|b@c", "..x", "-", int64(0), int64(1), int64(1))
	f.Add("i", "x", "y", "z", int64(253402300799), int64(3600), int64(lease.MaxEpoch-1))
	f.Fuzz(func(t *testing.T, issuer, sub, sid, tab string, iatSec, ttlSec, epoch int64) {
		if issuer == "" || iatSec < 0 || iatSec > 253402300799 || ttlSec < 1 || ttlSec > 86400 {
			return
		}
		c := Claims{Issuer: issuer, Subject: sub, Session: sid, Tab: tab, Epoch: epoch,
			IssuedAt: time.Unix(iatSec, 0), ExpiresAt: time.Unix(iatSec+ttlSec, 0)}
		if c.validate() != nil {
			return
		}
		s, err := NewSigner(&KeySet{}, issuer)
		if err != nil {
			t.Fatal(err)
		}
		iat, exp := c.times()
		want, err := json.Marshal(wireClaims{
			RegisteredClaims: jwt.RegisteredClaims{Issuer: issuer, Subject: sub,
				IssuedAt: jwt.NewNumericDate(iat), ExpiresAt: jwt.NewNumericDate(exp)},
			Sid: sid, Tab: tab, Epoch: epoch,
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.appendPayload(nil, c, iat, exp); !bytes.Equal(got, want) {
			t.Fatalf("appendPayload = %s\nencoding/json writes %s", got, want)
		}
	})
}
