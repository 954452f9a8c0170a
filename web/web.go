// Package web holds tablease's browser-side files, embedded in the binary: the browser client
// (sdk/tablease.js and its .d.ts), the admin console (admin/) and the two-tab demo (demo/). They
// are plain ES modules: no build step.
package web

import (
	"embed"
	"io/fs"
)

//go:embed admin sdk demo
var files embed.FS

// FS is the tree of browser files: admin/…, sdk/…, demo/….
func FS() fs.FS { return files }
