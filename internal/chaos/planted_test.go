package chaos_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/chaos"
)

// renewIgnoresTheEpoch stands in front of a tablease instance and plants a bug an engine could
// have: a renew that tablease refused (409 LEASE_LOST) is answered 200 with the lease the caller
// named, as if the renew ignored the epoch and the holder.
func renewIgnoresTheEpoch(t *testing.T, upstream string) *httptest.Server {
	hc := &http.Client{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := hc.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		if strings.HasSuffix(r.URL.Path, "/lease/renew") && resp.StatusCode == http.StatusConflict {
			var named struct {
				TabID string `json:"tabId"`
				Epoch int64  `json:"epoch"`
			}
			_ = json.Unmarshal(body, &named)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"held": true, "holder": map[string]any{"tabId": named.TabID, "label": "", "hidden": false},
				"epoch": named.Epoch, "role": "owner",
			})
			return
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestTheCheckerCatchesARenewThatIgnoresTheEpoch(t *testing.T) {
	c := chaos.StartCluster(t, 2)
	buggy := renewIgnoresTheEpoch(t, c.Instances[1].URL())
	rep := chaos.Run(t, c, chaos.Config{
		Name:          "planted-bug",
		Targets:       []string{c.Instances[0].URL(), buggy.URL},
		Clients:       8,
		Sessions:      3,
		Calls:         6,
		Histories:     120,
		Artifacts:     t.TempDir(),
		StopAtIllegal: true,
	})
	t.Logf("%d histories, %d operations checked; illegal %d", rep.Histories, rep.Ops, len(rep.Illegal))
	for _, e := range rep.Errors {
		t.Errorf("an answer the contract does not allow: %s", e)
	}
	if len(rep.Illegal) == 0 {
		t.Fatalf("the checker found all %d histories linearizable with a renew that ignores the epoch", rep.Histories)
	}
	for _, p := range rep.Illegal {
		html, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(html, []byte("<html")) {
			t.Errorf("no visualization of the illegal history at %s: %v", p, err)
		}
		if _, err := os.Stat(strings.TrimSuffix(p, ".html") + ".json"); err != nil {
			t.Errorf("no history beside the visualization: %v", err)
		}
	}
}
