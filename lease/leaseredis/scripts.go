package leaseredis

import (
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// The scripts. Each file starts with a header naming its KEYS and ARGV; state.lua, the shared
// prelude that reads the state hash and shapes the answers, is put in front of each. Every script
// validates its arguments and reads before it writes anything: Redis does not roll back a script
// that fails halfway.
var (
	//go:embed state.lua
	stateLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed renew.lua
	renewLua string
	//go:embed release.lua
	releaseLua string
	//go:embed check.lua
	checkLua string
	//go:embed get.lua
	getLua string

	acquireScript = newScript(acquireLua)
	renewScript   = newScript(renewLua)
	releaseScript = newScript(releaseLua)
	checkScript   = newScript(checkLua)
	getScript     = newScript(getLua)
)

func newScript(body string) *redis.Script { return redis.NewScript(stateLua + "\n" + body) }

// Statuses that the scripts answer first.
const (
	statusOK        = "OK"        // granted, renewed, confirmed, read
	statusHeld      = "HELD"      // acquire: another tab holds the lease
	statusExhausted = "EXHAUSTED" // acquire: the next epoch would reach 2^53
	statusLost      = "LOST"      // renew, check: the tab does not hold the lease at that epoch
	statusReleased  = "RELEASED"  // release: this call, or the call it retries, ended the lease
	statusKept      = "KEPT"      // release: nothing to release
)

// replyLen is the length of every script's answer: {status, held, tab, label, hidden, epoch,
// granted_us, expires_us, ttl_ms, transitions, now_us} (see reply in state.lua).
const replyLen = 11

// parseReply turns a script's answer into its status and the lease of key it describes.
func parseReply(key lease.Key, v any) (string, lease.Lease, error) {
	a, ok := v.([]any)
	if !ok || len(a) != replyLen {
		return "", lease.Lease{}, fmt.Errorf("leaseredis: malformed script reply %v", v)
	}
	status, ok1 := a[0].(string)
	tab, ok2 := a[2].(string)
	label, ok3 := a[3].(string)
	if !ok1 || !ok2 || !ok3 {
		return "", lease.Lease{}, fmt.Errorf("leaseredis: malformed script reply %v", v)
	}
	var n [8]int64 // held, hidden, epoch, granted_us, expires_us, ttl_ms, transitions, now_us
	for i, j := range []int{1, 4, 5, 6, 7, 8, 9, 10} {
		x, ok := a[j].(int64)
		if !ok || x < 0 {
			return "", lease.Lease{}, fmt.Errorf("leaseredis: malformed script reply %v", v)
		}
		n[i] = x
	}
	heldFlag, hidden, epoch, granted, expires, ttlMS, transitions, now := n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]
	if epoch >= lease.MaxEpoch || now == 0 {
		return "", lease.Lease{}, fmt.Errorf("leaseredis: script reply out of range %v", v)
	}
	l := lease.Lease{
		Key:         key,
		Held:        heldFlag == 1,
		Epoch:       epoch,
		TTL:         time.Duration(ttlMS) * time.Millisecond,
		Transitions: transitions,
		Now:         micros(now),
	}
	if granted != 0 {
		l.GrantedAt, l.ExpiresAt = micros(granted), micros(expires)
	}
	if l.Held {
		l.Holder = lease.Holder{TabID: tab, Label: label, Hidden: hidden == 1}
	}
	return status, l, nil
}

// micros is the time of a store clock reading in microseconds, in UTC like every time the engines
// answer.
func micros(us int64) time.Time { return time.UnixMicro(us).UTC() }
