// Package guardecho adapts package guard to Echo v4.
//
//	g, err := guard.New(guard.Options{
//		…,
//		Target: func(r *http.Request) (string, string, error) {
//			return userOf(r), r.PathValue("sid"), nil // Echo's :sid, see Middleware
//		},
//	})
//	e.POST("/api/sessions/:sid/events", saveEvent, guardecho.Middleware(g))
//
//	func saveEvent(c echo.Context) error {
//		lease, _ := guardecho.Claims(c) // lease.Epoch fences the write
//		…
//	}
//
// Rejections are written directly, in the guard's JSON error shape, without going through Echo's
// HTTPErrorHandler (whose default would reshape them).
package guardecho

import (
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/owner/guard"
)

// Middleware runs g on every request that g.Applies to. Before the check it copies Echo's route
// parameters into the request's path values, decoded, so that Options.Target can read them with
// r.PathValue (":sid" becomes r.PathValue("sid")) as it would behind a net/http ServeMux: a
// session id sent percent-encoded ("a%3Ab", as the browser's encodeURIComponent writes "a:b") is
// "a:b" there, as in the lease token. (Echo's own c.Param stays as Echo gives it: encoded when
// the path had an escape that Go does not write by default, as in %3A.)
func Middleware(g *guard.Guard) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if names := c.ParamNames(); len(names) > 0 {
				r = r.WithContext(r.Context())
				for _, name := range names {
					r.SetPathValue(name, pathValue(r, c.Param(name)))
				}
			}
			if !g.Applies(r) {
				return next(c)
			}
			claims, err := g.Check(r)
			if err != nil {
				guard.WriteError(c.Response(), err)
				return nil
			}
			c.SetRequest(r.WithContext(guard.NewContext(r.Context(), claims)))
			return next(c)
		}
	}
}

// pathValue is the decoded value of the route parameter v. Echo routes on the URL's RawPath when
// it has one (the path had escapes Go would not write, so its parameters are still encoded) and
// on its decoded Path otherwise, where decoding again would turn a literal "%41" into "A". A
// value that does not decode is left as it is: it names no valid session, which the guard refuses.
func pathValue(r *http.Request, v string) string {
	if r.URL.RawPath == "" {
		return v
	}
	if d, err := url.PathUnescape(v); err == nil {
		return d
	}
	return v
}

// Claims returns the claims the guard verified for this request.
func Claims(c echo.Context) (guard.Claims, bool) {
	return guard.FromContext(c.Request().Context())
}
