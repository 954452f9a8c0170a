// Package origin reads web origins (RFC 6454) as browsers send them in the Origin header:
// scheme://host[:port], with nothing else.
package origin

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Parse reads one origin, http or https, and answers it in the form a browser sends: scheme and
// host in lower case, the port only when it is not the scheme's default. A path (even "/"), query,
// fragment, userinfo, whitespace or any other scheme is an error that says what is wrong.
func Parse(s string) (string, error) {
	if s == "" {
		return "", errors.New("an origin must not be empty")
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return "", fmt.Errorf("%q holds whitespace", s)
	}
	if strings.Contains(s, "#") {
		return "", fmt.Errorf("%q has a fragment; an origin is scheme://host[:port]", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL", s)
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "http" && scheme != "https":
		return "", fmt.Errorf("%q must start with http:// or https://", s)
	case u.Opaque != "" || u.Host == "":
		return "", fmt.Errorf("%q has no host; an origin is scheme://host[:port]", s)
	case u.User != nil:
		return "", fmt.Errorf("%q has userinfo; an origin is scheme://host[:port]", s)
	case u.Path != "" || u.RawPath != "":
		return "", fmt.Errorf("%q has a path (a trailing slash included); an origin is scheme://host[:port]", s)
	case u.RawQuery != "" || u.ForceQuery:
		return "", fmt.Errorf("%q has a query; an origin is scheme://host[:port]", s)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return "", fmt.Errorf("%q has no host; an origin is scheme://host[:port]", s)
	}
	if strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("%q has an empty port", s)
	}
	host = strings.ToLower(host)
	if strings.Contains(host, ":") { // IPv6: url.Parse accepts it only in brackets
		if net.ParseIP(host) == nil {
			return "", fmt.Errorf("%q has an invalid IPv6 host", s)
		}
		host = "[" + host + "]"
	} else if !validHost(host) {
		return "", fmt.Errorf("%q has an invalid host: letters, digits, hyphens and dots only (a wildcard is not an origin)", s)
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || port[0] == '0' {
			return "", fmt.Errorf("%q has an invalid port", s)
		}
		if (scheme == "http" && n == 80) || (scheme == "https" && n == 443) {
			port = ""
		}
	}
	out := scheme + "://" + host
	if port != "" {
		out += ":" + port
	}
	return out, nil
}

// validHost reports whether host is a DNS name or an IPv4 address: dot-separated labels of
// [a-z0-9-], none empty (the caller lowercased it).
func validHost(host string) bool {
	for _, label := range strings.Split(host, ".") {
		if label == "" {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	return true
}
