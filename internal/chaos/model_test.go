package chaos_test

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"

	"github.com/tablease/tablease/internal/chaos"
)

// call is one call of a hand-written history. Calls follow one another unless concurrent is set,
// in which case the call overlaps the one before it; an unknown outcome returns after all.
type call struct {
	in         chaos.Input
	out        chaos.Output
	concurrent bool
}

func acquire(tab string) chaos.Input  { return chaos.Input{Kind: chaos.Acquire, Tab: tab} }
func takeover(tab string) chaos.Input { return chaos.Input{Kind: chaos.Takeover, Tab: tab} }
func newEpoch(tab string) chaos.Input { return chaos.Input{Kind: chaos.NewEpoch, Tab: tab} }
func renew(tab string, e int64) chaos.Input {
	return chaos.Input{Kind: chaos.Renew, Tab: tab, Epoch: e}
}
func release(tab string, e int64) chaos.Input {
	return chaos.Input{Kind: chaos.Release, Tab: tab, Epoch: e}
}
func check(tab string, e int64) chaos.Input {
	return chaos.Input{Kind: chaos.Check, Tab: tab, Epoch: e}
}
func get(tab string) chaos.Input { return chaos.Input{Kind: chaos.Get, Tab: tab} }

var lost = chaos.Input{Kind: chaos.Lost}

func granted(tab string, e int64) chaos.Output {
	return chaos.Output{Result: chaos.Granted, Holder: tab, Epoch: e}
}
func held(tab string, e int64) chaos.Output {
	return chaos.Output{Result: chaos.Held, Holder: tab, Epoch: e}
}
func renewed(tab string, e int64) chaos.Output {
	return chaos.Output{Result: chaos.Renewed, Holder: tab, Epoch: e}
}
func lostErr(tab string, e int64) chaos.Output {
	return chaos.Output{Result: chaos.LostErr, Holder: tab, Epoch: e}
}
func read(tab string, e int64) chaos.Output {
	return chaos.Output{Result: chaos.Read, HeldNow: tab != "", Holder: tab, Epoch: e}
}

var (
	unknown  = chaos.Output{Unknown: true}
	released = chaos.Output{Result: chaos.Released}
	kept     = chaos.Output{Result: chaos.Kept}
	done     = chaos.Output{Result: chaos.Done}
)

func history(calls []call) []porcupine.Operation {
	ops := make([]porcupine.Operation, len(calls))
	for i, c := range calls {
		callAt := int64(10 * i)
		if c.concurrent {
			callAt = int64(10*(i-1)) + 1
		}
		ret := int64(10*i) + 5
		if c.out.Unknown {
			ret = math.MaxInt64
		}
		ops[i] = porcupine.Operation{ClientId: i % 3, Input: c.in, Output: c.out, Call: callAt, Return: ret}
	}
	return ops
}

func TestTheModelAcceptsWhatTheContractAllowsAndNothingElse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []call
		ok    bool
	}{
		{"a grant, renews and checks at its epoch and a release are linearizable", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: renew("a", 100), out: renewed("a", 100)},
			{in: check("a", 100), out: chaos.Output{Result: chaos.Valid, Holder: "a", Epoch: 100}},
			{in: release("a", 100), out: released},
			{in: get("b"), out: read("", 100)},
		}, true},
		{"the holder acquiring again keeps its epoch", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: acquire("a"), out: granted("a", 100)},
			{in: takeover("a"), out: granted("a", 100)},
		}, true},
		{"the holder acquiring again with a new epoch is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: acquire("a"), out: granted("a", 101)},
		}, false},
		{"the holder asking for a new epoch gets a greater one, and its old one is over", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: newEpoch("a"), out: granted("a", 150)},
			{in: renew("a", 100), out: lostErr("a", 150)},
			{in: newEpoch("b"), out: held("a", 150)},
			{in: release("a", 150), out: released},
			{in: newEpoch("b"), out: granted("b", 151)},
		}, true},
		{"the holder asking for a new epoch and keeping its own is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: newEpoch("a"), out: granted("a", 100)},
		}, false},
		{"another tab asking for a new epoch of a held lease and granted is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: newEpoch("b"), out: granted("b", 101)},
		}, false},
		{"an unknown new epoch of the holder leaves its old epoch over or in force", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: newEpoch("a"), out: unknown},
			{in: renew("a", 100), out: lostErr("a", 120)},
			{in: get("b"), out: read("a", 120)},
		}, true},
		{"another tab's try is refused with the holder and its epoch", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: acquire("b"), out: held("a", 100)},
		}, true},
		{"two tabs granted by try without a release between is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: acquire("b"), out: granted("b", 200)},
		}, false},
		{"a takeover grants a greater epoch", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: takeover("b"), out: granted("b", 101)},
			{in: renew("a", 100), out: lostErr("b", 101)},
		}, true},
		{"a takeover that shows the same epoch is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: takeover("b"), out: granted("b", 100)},
		}, false},
		{"a renew at an epoch the tab does not hold succeeding is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: takeover("b"), out: granted("b", 101)},
			{in: renew("a", 100), out: renewed("a", 100)},
		}, false},
		{"a renew by the holder at its epoch refused is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: renew("a", 100), out: lostErr("a", 100)},
		}, false},
		{"a stale release frees nothing", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: release("a", 99), out: kept},
			{in: acquire("b"), out: granted("b", 200)},
		}, false},
		{"a retried release answers true again, and false once the lease is granted again", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: release("a", 100), out: released},
			{in: release("a", 100), out: released},
			{in: acquire("b"), out: granted("b", 101)},
			{in: release("a", 100), out: kept},
		}, true},
		{"concurrent calls may take effect in either order", []call{
			{in: acquire("a"), out: held("b", 100)},
			{in: acquire("b"), out: granted("b", 100), concurrent: true},
		}, true},
		{"an acquire whose answer was lost may have granted the lease", []call{
			{in: acquire("a"), out: unknown},
			{in: acquire("b"), out: held("a", 100)},
			{in: renew("b", 100), out: lostErr("a", 100)},
		}, true},
		{"an acquire whose answer was lost may not have granted it", []call{
			{in: acquire("a"), out: unknown},
			{in: acquire("b"), out: granted("b", 100)},
		}, true},
		{"a lost answer explains one grant, not two", []call{
			{in: acquire("a"), out: unknown},
			{in: get("c"), out: read("a", 100)},
			{in: acquire("b"), out: granted("b", 200)},
		}, false},
		{"a release whose answer was lost may have freed the lease", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: release("a", 100), out: unknown},
			{in: acquire("b"), out: granted("b", 101)},
		}, true},
		{"a lease vanishing without a loss of the store is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: acquire("b"), out: granted("b", 200)},
			{in: renew("a", 100), out: lostErr("b", 200)},
		}, false},
		{"after the store lost its data the lease is free, and the next epoch is still greater", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: lost, out: done},
			{in: renew("a", 100), out: lostErr("", 0)},
			{in: get("c"), out: read("", 0)},
			{in: acquire("b"), out: granted("b", 200)},
		}, true},
		{"after the store lost its data an older epoch is a violation", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: lost, out: done},
			{in: acquire("b"), out: granted("b", 50)},
		}, false},
		{"a loss of the store takes effect within its interval only", []call{
			{in: acquire("a"), out: granted("a", 100)},
			{in: renew("a", 100), out: lostErr("", 0)},
			{in: lost, out: done},
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := porcupine.CheckOperationsVerbose(chaos.Model, history(tc.calls), 0)
			want := porcupine.Illegal
			if tc.ok {
				want = porcupine.Ok
			}
			if res != want {
				t.Errorf("porcupine says %s, want %s", res, want)
			}
		})
	}
}
