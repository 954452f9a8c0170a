package chaos

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// History records the calls made to one session. It is safe for concurrent use.
type History struct {
	Session string

	mu  sync.Mutex // protects ops
	ops []porcupine.Operation
}

// Clock gives monotonic timestamps in nanoseconds since it was made.
type Clock struct{ start time.Time }

// NewClock starts a clock.
func NewClock() Clock { return Clock{start: time.Now()} }

// Now is the time since the clock started, from the monotonic clock.
func (c Clock) Now() int64 { return int64(time.Since(c.start)) }

// Add records a call of client made at call that answered at ret. A call whose outcome is unknown
// and that cannot change the state is left out (see MayChange).
func (h *History) Add(client int, in Input, out Output, call, ret int64) {
	if out.Unknown && !MayChange(in.Kind) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
}

// Operations answers the history for porcupine: calls whose outcome is unknown return after every
// other call.
func (h *History) Operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := append([]porcupine.Operation(nil), h.ops...)
	for i := range ops {
		if ops[i].Output.(Output).Unknown {
			ops[i].Return = math.MaxInt64
		}
	}
	return ops
}

// Verdict is the result of checking one history.
type Verdict struct {
	Result porcupine.CheckResult
	Ops    int
	Path   string // where the history and its visualization were written, when not Ok
}

// Check checks the history against Model within timeout. When the history is not linearizable, or
// the check did not finish, it writes the history (JSON) and porcupine's visualization (HTML) under
// dir and answers their path.
func (h *History) Check(timeout time.Duration, dir string) (Verdict, error) {
	ops := h.Operations()
	res, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	v := Verdict{Result: res, Ops: len(ops)}
	if res == porcupine.Ok {
		return v, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return v, err
	}
	base := filepath.Join(dir, fmt.Sprintf("history-%s", h.Session))
	type op struct {
		Client int    `json:"client"`
		Call   int64  `json:"callNs"`
		Return int64  `json:"returnNs"`
		Input  Input  `json:"input"`
		Output Output `json:"output"`
		Says   string `json:"says"`
	}
	dump := struct {
		Session string `json:"session"`
		Result  string `json:"result"`
		Ops     []op   `json:"operations"`
	}{Session: h.Session, Result: string(res)}
	for _, o := range ops {
		in, out := o.Input.(Input), o.Output.(Output)
		dump.Ops = append(dump.Ops, op{o.ClientId, o.Call, o.Return, in, out, describe(in, out)})
	}
	b, err := json.MarshalIndent(dump, "", "  ")
	if err != nil {
		return v, err
	}
	if err := os.WriteFile(base+".json", b, 0o644); err != nil {
		return v, err
	}
	if err := porcupine.VisualizePath(Model, info, base+".html"); err != nil {
		return v, err
	}
	v.Path = base + ".html"
	return v, nil
}
