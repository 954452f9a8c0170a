// Package web holds tablease's browser-side files, embedded in the binary: the browser client
// (sdk/tablease.js, the modules it imports, and its .d.ts), the admin console (admin/) and the
// two-tab demo (demo/). They are plain ES modules: no build step.
package web

import (
	"embed"
	"io/fs"
)

// Only the client itself is shipped from sdk/ (*.js): its tests and test doubles (*.mjs) stay out
// of the binary.
//
//go:embed admin demo sdk/*.js sdk/tablease.d.ts
var files embed.FS

// FS is the tree of browser files: admin/…, sdk/…, demo/….
func FS() fs.FS { return files }
