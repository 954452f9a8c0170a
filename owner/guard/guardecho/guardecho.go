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
	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/owner/guard"
)

// Middleware runs g on every request that g.Applies to. Before the check it copies Echo's route
// parameters into the request's path values, so that Options.Target can read them with
// r.PathValue (":sid" becomes r.PathValue("sid")) as it would behind a net/http ServeMux.
func Middleware(g *guard.Guard) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			if names := c.ParamNames(); len(names) > 0 {
				r = r.WithContext(r.Context())
				for _, name := range names {
					r.SetPathValue(name, c.Param(name))
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

// Claims returns the claims the guard verified for this request.
func Claims(c echo.Context) (guard.Claims, bool) {
	return guard.FromContext(c.Request().Context())
}
