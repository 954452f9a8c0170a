// Command httpfloor is the floor scripts/bench measures tablease against: an Echo server on
// net/http, as tablease is, that answers the lease calls of `tablease bench` (acquire, renew,
// release) with a fixed lease answer of the size of tablease's and its headers, having read the
// request's body, and does nothing else: no authentication, no decoding, no Redis, no log. Its
// CPU per call is what one HTTP/1.1 request costs a Go server on the machine, below which no
// server on net/http goes, whatever its own work.
//
//	go run ./scripts/httpfloor 127.0.0.1:8080
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/labstack/echo/v4"
)

// answer is a lease answer as tablease gives it, 660 bytes with its lease token.
const answer = `{"sessionId":"s1","held":true,"holder":{"tabId":"t","label":"","hidden":false},"epoch":1796511251642` +
	`046,"grantedAt":"2026-12-05T22:54:11.642Z","expiresAt":"2026-12-05T22:55:11.642Z","ttlMs":60000,"rem` +
	`ainingMs":60000,"renewAfterMs":20000,"transitions":1,"role":"owner","blockedUntil":null,"token":"eyJ` +
	`hbGciOiJFZERTQSIsImtpZCI6ImdTS194emNBUzN2S1phQXJ0ZzExcUllb0JTU3U2S1FmR2xkZFU0eFZlc3MiLCJ0eXAiOiJ0YWJ` +
	`sZWFzZS1sZWFzZStqd3QifQ.eyJpc3MiOiJ0YWJsZWFzZSIsInN1YiI6InUyIiwiZXhwIjoxNzk2NTExMzExLCJpYXQiOjE3OTY1` +
	`MTEyNTEsInNpZCI6InMxIiwidGFiIjoidCIsImVwb2NoIjoxNzk2NTExMjUxNjQyMDQ2fQ.PIPAK8O4V-nU2DA2euh6bAw9rMxaE` +
	`YyxStpthv-F1BWeNA22a7RrlbL6iNvQ4pAGukOB6ae4UztO2-Oee8sUCg"}
`

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: httpfloor <host:port>")
		os.Exit(2)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	body := []byte(answer)
	lease := func(c echo.Context) error {
		if _, err := io.Copy(io.Discard, c.Request().Body); err != nil {
			return err
		}
		h := c.Response().Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Request-Id", "07ebc378a3dc5cd85c67bc3c7bd85d81")
		return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body)
	}
	e.POST("/v1/sessions/:sid/lease", lease)
	e.POST("/v1/sessions/:sid/lease/renew", lease)
	e.POST("/v1/sessions/:sid/lease/release", lease)
	if err := http.ListenAndServe(os.Args[1], e); err != nil {
		fmt.Fprintln(os.Stderr, "httpfloor:", err)
		os.Exit(1)
	}
}
