package catalog

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Route patterns and how a concrete route matches them: docs/catalog.md, "Route patterns".

const maxPatternLen = 512

type segKind uint8

const (
	segLiteral segKind = iota
	segParam
	segWildcard
)

type segment struct {
	kind segKind
	lit  string
}

// pattern is a parsed route pattern. A wildcard, if any, is the last segment.
type pattern struct {
	src  string
	segs []segment
}

func (p pattern) wildcard() bool {
	return len(p.segs) > 0 && p.segs[len(p.segs)-1].kind == segWildcard
}

// fixed is the segments before the wildcard (all of them when there is none).
func (p pattern) fixed() []segment {
	if p.wildcard() {
		return p.segs[:len(p.segs)-1]
	}
	return p.segs
}

func parsePattern(s string) (pattern, error) {
	switch {
	case s == "":
		return pattern{}, fmt.Errorf("must not be empty")
	case len(s) > maxPatternLen:
		return pattern{}, fmt.Errorf("must be at most %d bytes", maxPatternLen)
	case s[0] != '/':
		return pattern{}, fmt.Errorf(`must start with "/"`)
	case s == "/":
		return pattern{src: s}, nil
	case strings.HasSuffix(s, "/"):
		return pattern{}, fmt.Errorf(`must not end with "/"`)
	}
	parts := strings.Split(s[1:], "/")
	p := pattern{src: s, segs: make([]segment, 0, len(parts))}
	for i, part := range parts {
		switch {
		case part == "":
			return pattern{}, fmt.Errorf("segment %d is empty", i+1)
		case part == "*":
			if i != len(parts)-1 {
				return pattern{}, fmt.Errorf(`"*" may only be the last segment`)
			}
			p.segs = append(p.segs, segment{kind: segWildcard})
		case part[0] == ':':
			if !paramName(part[1:]) {
				return pattern{}, fmt.Errorf("parameter %q must be \":\" and a name of [A-Za-z_][A-Za-z0-9_]*", part)
			}
			p.segs = append(p.segs, segment{kind: segParam})
		default:
			for _, r := range part {
				if r >= utf8.RuneSelf || !literalByte(byte(r)) {
					return pattern{}, fmt.Errorf("segment %q: character %q is not allowed (use A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) + , ; = @ %% :, \":name\" or a final \"*\")", part, r)
				}
			}
			p.segs = append(p.segs, segment{kind: segLiteral, lit: part})
		}
	}
	return p, nil
}

func paramName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func literalByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()+,;=@%:", c) >= 0
}

// match reports whether the normalized route segments segs match p.
func (p pattern) match(segs []string) bool {
	fixed := p.fixed()
	if p.wildcard() {
		if len(segs) <= len(fixed) {
			return false
		}
	} else if len(segs) != len(fixed) {
		return false
	}
	for i, s := range fixed {
		if s.kind == segLiteral && s.lit != segs[i] {
			return false
		}
	}
	return true
}

// overlaps reports whether some concrete route matches both p and q.
func overlaps(p, q pattern) bool {
	pf, qf := p.fixed(), q.fixed()
	n := min(len(pf), len(qf))
	for i := 0; i < n; i++ {
		a, b := pf[i], qf[i]
		if a.kind == segLiteral && b.kind == segLiteral && a.lit != b.lit {
			return false
		}
	}
	switch {
	case !p.wildcard() && !q.wildcard():
		return len(pf) == len(qf)
	case p.wildcard() && q.wildcard():
		// The longer fixed part is absorbed by the shorter one's wildcard.
		return true
	case p.wildcard():
		// q's extra fixed segments (at least one) go to p's wildcard.
		return len(qf) > len(pf)
	default:
		return len(pf) > len(qf)
	}
}

// compareSpecificity orders patterns from most to least specific: segment by segment a literal
// beats a parameter, which beats a wildcard; then the longer pattern wins. It returns <0 when p is
// more specific than q.
func compareSpecificity(p, q pattern) int {
	n := min(len(p.segs), len(q.segs))
	for i := 0; i < n; i++ {
		if d := int(p.segs[i].kind) - int(q.segs[i].kind); d != 0 {
			return d
		}
	}
	return len(q.segs) - len(p.segs)
}

// maxRouteLen bounds a concrete route.
const maxRouteLen = 2048

// CheckRoute reports whether route is a concrete route a tab may report: it starts with "/", has at
// most 2048 bytes, and contains only printable ASCII other than space (browsers percent-encode
// everything else in location.pathname). A query or fragment is allowed and ignored.
func CheckRoute(route string) error {
	switch {
	case route == "":
		return fmt.Errorf("catalog: route must not be empty")
	case len(route) > maxRouteLen:
		return fmt.Errorf("catalog: route must be at most %d bytes", maxRouteLen)
	case route[0] != '/':
		return fmt.Errorf(`catalog: route must start with "/"`)
	}
	for i := 0; i < len(route); i++ {
		if c := route[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("catalog: route may contain only printable ASCII characters other than space")
		}
	}
	return nil
}

// routeSegments normalizes a concrete route into its segments; ok is false when the route is not
// valid (see CheckRoute).
func routeSegments(route string) (segs []string, ok bool) {
	if CheckRoute(route) != nil {
		return nil, false
	}
	if i := strings.IndexAny(route, "?#"); i >= 0 {
		route = route[:i]
	}
	for _, s := range strings.Split(route, "/") {
		if s != "" {
			segs = append(segs, s)
		}
	}
	return segs, true
}
