package origin

import "testing"

func TestOriginsAreReadInTheFormOfTheOriginHeader(t *testing.T) {
	good := map[string]string{
		"https://app.example.com":      "https://app.example.com",
		"HTTPS://App.Example.COM":      "https://app.example.com",
		"http://localhost:5173":        "http://localhost:5173",
		"https://app.example.com:443":  "https://app.example.com",
		"http://127.0.0.1:80":          "http://127.0.0.1",
		"https://app.example.com:8443": "https://app.example.com:8443",
		"http://[::1]:3000":            "http://[::1]:3000",
		"http://xn--bcher-kva.example": "http://xn--bcher-kva.example",
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := []string{
		"", "*", "null", "app.example.com", "ftp://app.example.com", "https://app.example.com/",
		"https://app.example.com/path", "https://app.example.com?q=1", "https://app.example.com?",
		"https://app.example.com#x", "https://user@app.example.com", "https://user:pw@app.example.com",
		"https://", "https://:8080", "https://app.example.com:", "https://app.example.com:0",
		"https://app.example.com:65536", "https://app.example.com:08080", "https://app.example.com:x",
		" https://app.example.com", "https://app.example .com", "//app.example.com", "https:app.example.com",
		"https://*.example.com", "https://app..example.com", "https://app.example.com.", "https://app_1.example.com",
	}
	for _, in := range bad {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %q, want an error", in, got)
		}
	}
}
