// Package chaos checks that tablease's lease API is linearizable while things go wrong.
//
// Clients (one tab each) call two tablease instances that share one Redis, while a fault is
// injected: Redis paused, Redis killed and restarted empty, FLUSHALL, a TCP proxy that delays and
// resets the connections to Redis, a tablease instance killed and restarted, and (on a primary, a
// replica and three sentinels) the primary killed and the replica promoted. Every call is
// recorded with its call and return times, and the history of each session is checked with
// porcupine against Model, a sequential specification of one session written from the HTTP
// contract (README "HTTP API", docs/DESIGN.md §3). An illegal history is written, with porcupine's
// visualization, to a file.
//
// # The model
//
// The state of a session is its holder (a tab, or none) and its epoch. Epochs are opaque: the
// model never predicts one, it records the epoch an answer shows and checks that every new grant
// shows a strictly greater one. Acquire in mode try grants a free lease with a new epoch, grants
// the holder its own epoch again, and otherwise answers LEASE_HELD naming the holder; takeover
// grants a new epoch unless the caller already holds the lease, which keeps its epoch (guarantee 4:
// a retried takeover never mints a second epoch); an acquire in mode try asking for a new epoch
// (newEpoch) is a try that grants the holder a new epoch too. Renew and check succeed only for the holder at
// its epoch, else LEASE_LOST with the current holder in its details; release by the holder at its
// epoch frees the lease, a retry of that release answers true again, and any other release answers
// false and changes nothing. Get answers the holder and epoch (the last epoch when free). TTLs are
// far longer than a history, so nothing expires and the model needs no clock.
//
// # Unknown outcomes
//
// An answer that never came (a network error, a timeout) and 503 STORE_UNAVAILABLE say nothing
// about whether the call took effect: a script may have run, or may still run once a paused Redis
// continues. Such a call is recorded with Output.Unknown set and a return time after every other
// call of its history (as porcupine's documentation and etcd's robustness tests do), and the model
// lets it take effect or not. When it took effect with a grant whose epoch nobody saw, the state
// keeps a lower bound instead of the epoch (State.Exact false), and the first answer that shows the
// epoch fixes it. Unknown calls that cannot change the state (renew, check, get) are left out.
//
// # Data loss
//
// When Redis loses its data (FLUSHALL, a restart without persistence) the lease a tab held is gone:
// its renew answers LEASE_LOST and a try may grant to another tab. The contract allows this only
// as a consequence of the loss, and guarantee 2 says what survives it: epochs keep increasing,
// since they are floored at the store's clock. So the loss is an explicit step of the history: the
// scenario records a Lost call whose interval brackets the fault (called before the fault starts,
// returning once it is over), and the model frees the session there, keeping the last epoch as a
// lower bound for the next grant. Everywhere else the model stays strict: a lease that vanishes
// without a Lost step in the history is a violation.
//
// # Lost replies
//
// The proxy resets connections before a command reaches Redis in one scenario, and after Redis ran
// it, losing its reply, in another. A lost reply makes the driver send the script again (leaseredis
// retries a failed command twice, 8 to 100 ms apart), maybe after other calls ran; the script then
// answers from its first run and changes nothing (docs/engines.md), so the call still takes effect
// once, and the history stays linearizable.
package chaos

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Kind is the kind of a call.
type Kind uint8

// The calls of the lease API, and the loss of the store's data.
const (
	Acquire  Kind = iota // POST …/lease, mode try
	Takeover             // POST …/lease, mode takeover
	Renew                // POST …/lease/renew
	Release              // POST …/lease/release
	Check                // POST …/lease/check
	Get                  // GET …/lease?tabId=
	Lost                 // the store lost its data (a step of the scenario, not a call)
	NewEpoch             // POST …/lease, mode try, newEpoch
)

var kindNames = [...]string{"acquire", "takeover", "renew", "release", "check", "get", "lost", "new_epoch"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Input is a call: its kind, the calling tab and the epoch it names (renew, release, check).
type Input struct {
	Kind  Kind   `json:"kind"`
	Tab   string `json:"tab,omitempty"`
	Epoch int64  `json:"epoch,omitempty"`
}

// Result is what an answer said.
type Result uint8

// The answers of the lease API.
const (
	Granted  Result = iota + 1 // 200 lease to an acquire: Holder, Epoch
	Held                       // 409 LEASE_HELD: Holder, Epoch from details
	Renewed                    // 200 lease to a renew: Epoch
	LostErr                    // 409 LEASE_LOST: Holder, Epoch from details ("" when free)
	Released                   // 200 {"released": true}
	Kept                       // 200 {"released": false}
	Valid                      // 200 {"valid": true}
	Read                       // 200 lease to a get: HeldNow, Holder, Epoch
	Done                       // the Lost step happened
)

var resultNames = [...]string{"", "granted", "LEASE_HELD", "renewed", "LEASE_LOST", "released", "kept", "valid", "read", "done"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("result(%d)", r)
}

// Output is an answer. Unknown is set when the call's outcome is unknown (no answer, or 503).
type Output struct {
	Unknown bool   `json:"unknown,omitempty"`
	Result  Result `json:"result,omitempty"`
	HeldNow bool   `json:"held,omitempty"`
	Holder  string `json:"holder,omitempty"`
	Epoch   int64  `json:"epoch,omitempty"`
}

// State is the state of one session. Holder is "" while the lease is free. Epoch is the current
// epoch while held and the last one when free, when Exact; when not Exact, the epoch is unknown
// but greater than Epoch. RelTab is the tab whose release freed the lease at Epoch (a retry of that
// release answers true), "" when the store does not remember one.
type State struct {
	Holder string
	Epoch  int64
	Exact  bool
	RelTab string
}

func (s State) String() string {
	e := fmt.Sprintf("%d", s.Epoch)
	if !s.Exact {
		e = ">" + e
	}
	if s.Holder == "" {
		return fmt.Sprintf("free epoch %s released by %q", e, s.RelTab)
	}
	return fmt.Sprintf("held by %s epoch %s", s.Holder, e)
}

// matches reports whether epoch can be the current epoch of s.
func (s State) matches(epoch int64) bool {
	if s.Exact {
		return s.Epoch == epoch
	}
	return epoch > s.Epoch
}

// is reports whether tab holds the lease at epoch for certain.
func (s State) is(tab string, epoch int64) bool {
	return s.Holder == tab && s.Exact && s.Epoch == epoch
}

func bound(s State, epoch int64) State { s.Epoch, s.Exact = epoch, true; return s }

// step answers the states that s can become when in answers out; none when it cannot.
func step(s State, in Input, out Output) []State {
	if out.Unknown {
		return append([]State{s}, effects(s, in)...)
	}
	switch in.Kind {
	case Acquire, Takeover, NewEpoch:
		switch out.Result {
		case Granted:
			if out.Holder != in.Tab {
				return nil
			}
			switch {
			case in.Kind == NewEpoch && (s.Holder == in.Tab || s.Holder == "") && out.Epoch > s.Epoch:
				return []State{{Holder: in.Tab, Epoch: out.Epoch, Exact: true}}
			case in.Kind == NewEpoch:
			case s.Holder == in.Tab && s.matches(out.Epoch):
				return []State{bound(s, out.Epoch)}
			case s.Holder == in.Tab:
				return nil
			case (s.Holder == "" || in.Kind == Takeover) && out.Epoch > s.Epoch:
				return []State{{Holder: in.Tab, Epoch: out.Epoch, Exact: true}}
			}
		case Held:
			if in.Kind != Takeover && s.Holder != "" && s.Holder != in.Tab && out.Holder == s.Holder && s.matches(out.Epoch) {
				return []State{bound(s, out.Epoch)}
			}
		}
	case Renew, Check:
		want := Renewed
		if in.Kind == Check {
			want = Valid
		}
		switch out.Result {
		case want:
			if s.Holder == in.Tab && s.matches(in.Epoch) && out.Holder == in.Tab && out.Epoch == in.Epoch {
				return []State{bound(s, in.Epoch)}
			}
		case LostErr:
			if s.is(in.Tab, in.Epoch) {
				return nil
			}
			if out.Holder == "" {
				if s.Holder == "" {
					return []State{s}
				}
				return nil
			}
			if out.Holder == s.Holder && s.matches(out.Epoch) && !(out.Holder == in.Tab && out.Epoch == in.Epoch) {
				return []State{bound(s, out.Epoch)}
			}
		}
	case Release:
		retry := s.Holder == "" && s.RelTab == in.Tab && s.Exact && s.Epoch == in.Epoch
		switch out.Result {
		case Released:
			if retry {
				return []State{s}
			}
			if s.Holder == in.Tab && s.matches(in.Epoch) {
				return []State{{Epoch: in.Epoch, Exact: true, RelTab: in.Tab}}
			}
		case Kept:
			if !retry && !s.is(in.Tab, in.Epoch) {
				return []State{s}
			}
		}
	case Get:
		if out.Result != Read {
			return nil
		}
		if out.HeldNow {
			if out.Holder == s.Holder && s.Holder != "" && s.matches(out.Epoch) {
				return []State{bound(s, out.Epoch)}
			}
			return nil
		}
		if s.Holder == "" && (!s.Exact || s.Epoch == out.Epoch) {
			return []State{s}
		}
	case Lost:
		return []State{{Epoch: s.Epoch}}
	}
	return nil
}

// effects answers the states that s can become when in takes effect with an answer nobody saw.
func effects(s State, in Input) []State {
	switch in.Kind {
	case Acquire:
		if s.Holder == "" {
			return []State{{Holder: in.Tab, Epoch: s.Epoch}}
		}
	case Takeover:
		if s.Holder != in.Tab {
			return []State{{Holder: in.Tab, Epoch: s.Epoch}}
		}
	case NewEpoch:
		if s.Holder == "" || s.Holder == in.Tab {
			return []State{{Holder: in.Tab, Epoch: s.Epoch}}
		}
	case Release:
		if s.Holder == in.Tab && s.matches(in.Epoch) {
			return []State{{Epoch: in.Epoch, Exact: true, RelTab: in.Tab}}
		}
	case Lost:
		return []State{{Epoch: s.Epoch}}
	}
	return nil
}

// MayChange reports whether a call of kind k may change the state: the unknown outcome of any
// other call constrains nothing and is left out of histories.
func MayChange(k Kind) bool {
	return k == Acquire || k == Takeover || k == NewEpoch || k == Release || k == Lost
}

// Model is the sequential specification of one session, for porcupine.
var Model = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{State{Exact: true}} },
	Step: func(state, input, output any) []any {
		next := step(state.(State), input.(Input), output.(Output))
		states := make([]any, len(next))
		for i, s := range next {
			states[i] = s
		}
		return states
	},
	DescribeOperation: func(input, output any) string {
		return describe(input.(Input), output.(Output))
	},
	DescribeState: func(state any) string { return state.(State).String() },
}).ToModel()

func describe(in Input, out Output) string {
	call := in.Kind.String()
	switch in.Kind {
	case Acquire, Takeover, Get:
		call += "(" + in.Tab + ")"
	case Renew, Release, Check:
		call += fmt.Sprintf("(%s, %d)", in.Tab, in.Epoch)
	}
	switch {
	case out.Unknown:
		return call + " -> unknown"
	case out.Result == Read && !out.HeldNow:
		return fmt.Sprintf("%s -> free, epoch %d", call, out.Epoch)
	case out.Holder != "":
		return fmt.Sprintf("%s -> %s, %s at %d", call, out.Result, out.Holder, out.Epoch)
	case out.Epoch != 0:
		return fmt.Sprintf("%s -> %s at %d", call, out.Result, out.Epoch)
	}
	return call + " -> " + out.Result.String()
}
