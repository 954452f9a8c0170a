package api

import (
	"bytes"
	_ "embed"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"
)

// openapiYAML is the OpenAPI 3.1 document of every route the server registers. A test keeps the
// two in step.
//
//go:embed openapi.yaml
var openapiYAML []byte

func (s *Server) openapi(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", s.spec)
}

// specWithVersion is the document with the build version added to info as x-build-version.
func specWithVersion(version string) []byte {
	if version == "" {
		return openapiYAML
	}
	const anchor = "\n  version: \"1\"\n"
	i := bytes.Index(openapiYAML, []byte(anchor))
	if i < 0 {
		return openapiYAML
	}
	i += len(anchor)
	line := "  x-build-version: " + strconv.Quote(version) + "\n"
	out := make([]byte, 0, len(openapiYAML)+len(line))
	out = append(out, openapiYAML[:i]...)
	out = append(out, line...)
	return append(out, openapiYAML[i:]...)
}
