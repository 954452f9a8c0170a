package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestACatalogReplacementIsInTheAdminsAuditLog replaces the catalog and reads the audit log: the
// change is a "catalog" record of the acting admin, naming the new version.
func TestACatalogReplacementIsInTheAdminsAuditLog(t *testing.T) {
	h := catalogHarness(t)
	admin := h.adminToken("root")
	rec := h.putCatalog(admin, "*", eventsCatalog)
	if rec.Code != http.StatusOK {
		t.Fatalf("PUT answered %d %s", rec.Code, rec.Body)
	}
	next := mustCatalog(t, eventsCatalog)
	for _, path := range []string{"/v1/admin/audit?sub=root", "/v1/admin/audit"} {
		rec := h.get(path, admin)
		var page struct {
			Records []map[string]any `json:"records"`
		}
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &page) != nil {
			t.Fatalf("GET %s answered %d %s", path, rec.Code, rec.Body)
		}
		var found []map[string]any
		for _, r := range page.Records {
			if r["action"] == "catalog" {
				found = append(found, r)
			}
		}
		if len(found) != 1 {
			t.Fatalf("GET %s = %s, want one catalog record", path, rec.Body)
		}
		r := found[0]
		reason, _ := r["reason"].(string)
		if r["sub"] != "root" || r["admin"] != "root" || r["sessionId"] != "catalog" || r["tabId"] != nil || !strings.Contains(reason, next.Version) {
			t.Errorf("the catalog record = %v, want root's, naming version %s", r, next.Version)
		}
	}
}
