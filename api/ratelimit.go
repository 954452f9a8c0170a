package api

import (
	"container/list"
	"math"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// defaultLimiterCap bounds the number of users whose limiters are kept at once.
const defaultLimiterCap = 100_000

// ipLimiterCap bounds the number of client addresses whose limiters are kept at once (about
// 200 bytes each).
const ipLimiterCap = 50_000

// clientKey is the key of the per-address limit for the connection's peer (never a forwarding
// header): the IPv4 address, or the /64 prefix of an IPv6 address, since one host is commonly
// given a whole /64.
func clientKey(remoteAddr string) string {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		return netip.PrefixFrom(addr, 64).Masked().String()
	}
	return addr.String()
}

// userLimiter keeps one token bucket per key (a user's sub, or a clientKey for the per-address
// limit), in least-recently-used order. A bucket idle long enough to have refilled is dropped
// (that loses nothing); beyond cap keys the least recently seen is dropped (that forgives its
// debt, the price of bounded memory).
type userLimiter struct {
	limit rate.Limit
	burst int
	idle  time.Duration // a bucket unused this long is full again
	cap   int
	now   func() time.Time

	mu    sync.Mutex // protects lru and byKey
	lru   *list.List // of *limiterEntry, most recently used at the front
	byKey map[string]*list.Element
}

type limiterEntry struct {
	key      string
	lim      *rate.Limiter
	seen     time.Time
	refusing bool // the last request was refused
}

func newUserLimiter(perSecond float64, capacity int, now func() time.Time) *userLimiter {
	burst := int(math.Ceil(2 * perSecond))
	burst = max(burst, 1)
	idle := time.Duration(float64(burst) / perSecond * float64(time.Second))
	return &userLimiter{
		limit: rate.Limit(perSecond),
		burst: burst,
		idle:  max(idle, time.Second),
		cap:   capacity,
		now:   now,
		lru:   list.New(),
		byKey: make(map[string]*list.Element),
	}
}

// allow takes one token for key; when none is left it reports how long until one is, and whether
// this refusal is the first since the key's last request allowed (or since its bucket was new).
func (u *userLimiter) allow(key string) (ok bool, wait time.Duration, first bool) {
	now := u.now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.evict(now)
	var e *limiterEntry
	if el, ok := u.byKey[key]; ok {
		e = el.Value.(*limiterEntry)
		u.lru.MoveToFront(el)
	} else {
		e = &limiterEntry{key: key, lim: rate.NewLimiter(u.limit, u.burst)}
		u.byKey[key] = u.lru.PushFront(e)
	}
	e.seen = now
	first = !e.refusing
	r := e.lim.ReserveN(now, 1)
	if !r.OK() {
		e.refusing = true
		return false, time.Second, first
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		e.refusing = true
		return false, d, first
	}
	e.refusing = false
	return true, 0, false
}

// evict drops idle buckets and, beyond the cap, the least recently used. Call with mu held.
func (u *userLimiter) evict(now time.Time) {
	for el := u.lru.Back(); el != nil; el = u.lru.Back() {
		e := el.Value.(*limiterEntry)
		if now.Sub(e.seen) < u.idle && u.lru.Len() < u.cap {
			return
		}
		u.lru.Remove(el)
		delete(u.byKey, e.key)
	}
}
