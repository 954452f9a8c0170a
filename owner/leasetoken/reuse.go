package leasetoken

import (
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

// Reuse answers a holder that renews with the token it was given before, while that token has
// at least half its life left, so that a token is signed about once per half-life per holder
// instead of on every renew (signing is the largest cost of a renew). A token is reused only for
// the same user, session, tab and epoch, and only when it expires no later than the lease it is
// answered with: a reused token never proves more than a new one would. And only when it lives
// at least half a renew interval past the holder's next renew (lease.RenewAfter of the lease
// answered): a renew that lengthens the lease (a tab that goes hidden asks for a longer TTL) would
// otherwise hand back a token that expires long before the holder renews again, and its writes
// would be refused meanwhile. Otherwise Token signs a new one (exp = the lease's expiry) and
// remembers it.
//
// It remembers the token of each session it signed for until that token is past the first half
// of its life, when no renew may reuse it: at most a minute (reusePrune) later it is forgotten, so
// what it keeps follows the leases renewed through this instance lately, not every lease it ever
// granted. Past max tokens an arbitrary one is forgotten, which costs a signature, nothing else.
// Its methods are safe for concurrent use.
type Reuse struct {
	max int

	mu     sync.Mutex
	tokens map[lease.Key]reusable
	pruned time.Time // when tokens past their half-life were last forgotten
}

// reusePrune is how often a Reuse forgets the tokens past their half-life, on the store's clock.
const reusePrune = time.Minute

type reusable struct {
	tab           string
	epoch         int64
	iat, exp, mid time.Time // mid: iat + half the token's life
	token         string
}

// DefaultReuseMax bounds the tokens a Reuse remembers by default (some 25 MB at most): more
// sessions than that renewing through one instance within a token's half-life and a minute.
const DefaultReuseMax = 50_000

// NewReuse makes a Reuse that remembers at most max tokens (DefaultReuseMax when max < 1).
func NewReuse(max int) *Reuse {
	if max < 1 {
		max = DefaultReuseMax
	}
	return &Reuse{max: max, tokens: make(map[lease.Key]reusable)}
}

// Token is the lease token for the holder of l at the store time l.Now: the one remembered for
// that holder and epoch while l.Now is before its half-life, it does not outlive l and it lives
// past l's next renew by half a renew interval, else a new one from sign(ClaimsFor(l)).
func (r *Reuse) Token(l lease.Lease, sign func(Claims) (string, error)) (string, error) {
	r.mu.Lock()
	old, ok := r.tokens[l.Key]
	r.mu.Unlock()
	renew := lease.RenewAfter(l.TTL)
	if ok && old.tab == l.Holder.TabID && old.epoch == l.Epoch &&
		!l.Now.Before(old.iat) && l.Now.Before(old.mid) && !old.exp.After(l.ExpiresAt) &&
		!old.exp.Before(l.Now.Add(renew+renew/2)) {
		return old.token, nil
	}
	c := ClaimsFor(l)
	tok, err := sign(c)
	if err != nil {
		return "", err
	}
	// The half-life is the token's own, by the whole seconds it carries, so that a token it reuses
	// has half its life left by its claims, not only by the lease's times.
	iat, exp := c.times()
	next := reusable{tab: c.Tab, epoch: c.Epoch, iat: iat, exp: exp, mid: iat.Add(exp.Sub(iat) / 2), token: tok}
	r.mu.Lock()
	defer r.mu.Unlock()
	if l.Now.Sub(r.pruned) >= reusePrune {
		r.pruned = l.Now
		for k, t := range r.tokens {
			if !l.Now.Before(t.mid) {
				delete(r.tokens, k)
			}
		}
	}
	if _, ok := r.tokens[l.Key]; !ok && len(r.tokens) >= r.max {
		for k := range r.tokens { // an arbitrary one
			delete(r.tokens, k)
			break
		}
	}
	r.tokens[l.Key] = next
	return tok, nil
}
