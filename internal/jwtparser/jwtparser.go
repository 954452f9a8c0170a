// Package jwtparser is the one rule for how tablease's token verifiers read a compact JWS: access
// tokens (api) and lease tokens (owner/leasetoken). Its parts are read as base64url without
// padding, strictly: the bits a part's last character carries beyond its last byte must be zero.
// Read leniently, a signature has several spellings (4 for HS256, 16 for RS256, ES256 and EdDSA)
// that verify alike, and whatever is keyed on a token's text (the caches of verified tokens, an
// app's list of tokens already seen) would count one token as several.
package jwtparser

import "github.com/golang-jwt/jwt/v5"

// New is jwt.NewParser with opts and strict base64url decoding.
func New(opts ...jwt.ParserOption) *jwt.Parser {
	return jwt.NewParser(append(opts, jwt.WithStrictDecoding())...)
}
