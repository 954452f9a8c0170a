package api

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/web"
)

// The browser files embedded in the binary (package web), served without authentication:
//
//	GET /admin, /admin/…   the admin console (it asks for an admin token itself)
//	GET /demo, /demo/…     the two-tab demo, in dev mode or with Options.Demo only
//	GET /sdk/…             the browser client, e.g. /sdk/tablease.js
//
// A directory answers its index.html. /admin and /demo answer their index.html without a
// redirect, so their pages must name their files by absolute paths (/admin/admin.js). The demo is
// a single-page app: a path under /demo whose last segment has no extension (/demo/events/evt-1,
// one of its routes) answers its index.html too, so that its pages can be reloaded.

// pageCSP is the Content-Security-Policy of the admin console and the demo: their own files only,
// no inline script or style, no framing, requests to this origin only (so that no link can point
// the demo's requests, and the tokens they carry, at another server).
const pageCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// staticFile is one embedded file, read once.
type staticFile struct {
	body        []byte
	contentType string
	etag        string
}

// staticTree is the embedded files of one top directory (admin, demo, sdk), by path inside it.
type staticTree struct {
	files   map[string]staticFile
	headers map[string]string // set on every answer of the tree
	spa     bool              // an extensionless path that is no file answers index.html
}

// staticContentTypes are the types of the files the web tree holds. Anything else is
// application/octet-stream (nosniff keeps the browser from guessing).
var staticContentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".mjs":  "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".json": "application/json",
	".map":  "application/json",
	".ts":   "text/plain; charset=utf-8", // the .d.ts of the client
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
	".txt":  "text/plain; charset=utf-8",
}

func staticContentType(name string) string {
	ext := strings.ToLower(path.Ext(name))
	if ct, ok := staticContentTypes[ext]; ok {
		return ct
	}
	if ct := mime.TypeByExtension(ext); ct != "" {
		return ct
	}
	return "application/octet-stream"
}

// loadStaticTree reads every file under dir of fsys.
func loadStaticTree(fsys fs.FS, dir string, headers map[string]string) (*staticTree, error) {
	t := &staticTree{files: make(map[string]staticFile), headers: headers}
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		t.files[strings.TrimPrefix(p, dir+"/")] = staticFile{
			body:        body,
			contentType: staticContentType(p),
			etag:        `"` + hex.EncodeToString(sum[:12]) + `"`,
		}
		return nil
	})
	return t, err
}

// serve answers the file named by the rest of the path (the Echo wildcard), or 404.
func (t *staticTree) serve(c echo.Context) error {
	name := c.Param("*")
	if name == "" || strings.HasSuffix(name, "/") {
		name += "index.html"
	}
	f, ok := t.files[name]
	if !ok && t.spa && fs.ValidPath(name) && path.Ext(name) == "" {
		f, ok = t.files["index.html"]
	}
	if !ok || !fs.ValidPath(name) {
		return &Error{Code: CodeNotFound, Message: "no such file"}
	}
	h := c.Response().Header()
	for k, v := range t.headers {
		h.Set(k, v)
	}
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("ETag", f.etag)
	if noneMatch(c.Request().Header.Get("If-None-Match"), f.etag) {
		return c.NoContent(http.StatusNotModified)
	}
	return c.Blob(http.StatusOK, f.contentType, f.body)
}

// registerStatic adds the routes of the embedded browser files. The trees are read from the
// binary, so a failure is a build defect: it panics at start rather than serving half a console.
func (s *Server) registerStatic(e *echo.Echo) {
	trees := []struct {
		dir     string
		index   bool // the bare /dir answers its index.html
		spa     bool // so does every extensionless path under it that is no file
		headers map[string]string
	}{
		{"admin", true, false, map[string]string{
			"Cache-Control":           "private, no-cache",
			"Content-Security-Policy": pageCSP,
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
		}},
		{"demo", true, true, map[string]string{
			"Cache-Control":           "public, max-age=60",
			"Content-Security-Policy": pageCSP,
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
		}},
		{"sdk", false, false, map[string]string{
			"Cache-Control": "public, max-age=60",
			// Apps on other origins import the client as a module, which needs CORS. The files
			// are public and no credentials are involved.
			"Access-Control-Allow-Origin":  "*",
			"Cross-Origin-Resource-Policy": "cross-origin",
		}},
	}
	for _, tr := range trees {
		if tr.dir == "demo" && !s.dev && !s.demo {
			continue // a demo is for trying tablease out, not for a deployment's users
		}
		tree, err := loadStaticTree(web.FS(), tr.dir, tr.headers)
		if err != nil {
			panic("api: reading the embedded " + tr.dir + " files: " + err.Error())
		}
		tree.spa = tr.spa
		paths := []string{"/" + tr.dir + "/*"}
		if tr.index {
			paths = append(paths, "/"+tr.dir)
		}
		for _, p := range paths {
			getAndHead(e, p, tree.serve)
		}
	}
}
