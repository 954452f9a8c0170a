package api

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/lease"
)

// metrics are the collectors of the server, registered on Options.Registry.
type metrics struct {
	requests    *prometheus.CounterVec // route, method, status
	inFlight    prometheus.Gauge
	duration    *prometheus.HistogramVec // route, method
	leaseOps    *prometheus.CounterVec   // op, result
	storeErrors *prometheus.CounterVec   // op
	goneRetries *prometheus.CounterVec   // result
	store       *storeHealth             // logs the outages that storeErrors counts
}

func newMetrics(reg prometheus.Registerer, store *storeHealth) (*metrics, error) {
	m := &metrics{
		store: store,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_http_requests_total",
			Help: "HTTP requests answered, by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tablease_http_requests_in_flight",
			Help: "HTTP requests being served: received and not yet answered (an event stream counts until its connection is taken over, once its headers are sent; a lease socket until its handshake is answered, each of its calls while it is served).",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tablease_http_request_duration_seconds",
			Help:    "Time to answer HTTP requests, by route pattern and method.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route", "method"}),
		leaseOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_lease_operations_total",
			Help: "Lease operations, by operation (acquire, renew, release, get, check, join, admin_list, admin_get, admin_audit, admin_revoke) and result (ok, held, lost, invalid, handoff_pending, blocked, too_many_sessions, too_many_tabs, tab_gone, unavailable, canceled, error).",
		}, []string{"op", "result"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_store_errors_total",
			Help: "Lease store operations that failed because the store was unavailable or answered an unexpected error, by operation.",
		}, []string{"op"}),
		goneRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_gone_release_retries_total",
			Help: "Gone releases the store did not answer, retried by the server, by how the retries ended: served, refused, given_up (after the longest TTL), stopped (by the server's stop), dropped (too many being retried).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.inFlight, m.duration, m.leaseOps, m.storeErrors, m.goneRetries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Expose the store error counters at zero, so that a rate over them is defined from the start.
	for _, op := range []string{"acquire", "renew", "release", "get", "check", "admin_list", "admin_get", "admin_audit",
		"admin_revoke", "catalog", "tabs", "join", "leave", "watch", "new_nonce", "use_nonce", "ping"} {
		m.storeErrors.WithLabelValues(op)
	}
	for _, result := range []string{"served", "refused", "given_up", "stopped", "dropped"} {
		m.goneRetries.WithLabelValues(result)
	}
	return m, nil
}

// observeOp counts one lease operation by the class of its outcome, but for invalid input, which
// countInvalid counts: most of it never reaches the store.
func (m *metrics) observeOp(op string, err error) {
	result, served := "ok", true
	switch {
	case err == nil:
	case errors.Is(err, lease.ErrInvalid):
		return
	case errors.Is(err, lease.ErrHeld):
		result = "held"
	case errors.Is(err, lease.ErrLost):
		result = "lost"
	case errors.Is(err, lease.ErrHandoffPending):
		result = "handoff_pending"
	case errors.Is(err, lease.ErrBlocked):
		result = "blocked"
	case errors.Is(err, lease.ErrTooManySessions): // a bound the user reached, not a store failure
		result = "too_many_sessions"
	case errors.Is(err, lease.ErrTooManyTabs):
		result = "too_many_tabs"
	case errors.Is(err, lease.ErrTabGone):
		result = "tab_gone"
	case errors.Is(err, context.Canceled): // the client went away (or the server stops): not the store's doing
		m.leaseOps.WithLabelValues(op, "canceled").Inc()
		return
	case errors.Is(err, lease.ErrUnavailable):
		result, served = "unavailable", false
	default:
		result, served = "error", false
	}
	if served {
		m.store.answered()
	} else {
		m.storeFailed(op, err)
	}
	m.leaseOps.WithLabelValues(op, result).Inc()
}

// storeFailed counts a call of op that the store did not serve, but for one whose caller gave up
// (a client that went away, a server that stops), which says nothing of the store: counted, it
// would make every tab closed during a call a store outage in the log. A revoke too few replicas
// confirmed is a store error but no outage.
func (m *metrics) storeFailed(op string, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	m.storeErrors.WithLabelValues(op).Inc()
	if errors.Is(err, lease.ErrNotReplicated) {
		return // Redis answered, and the revoke's own warning says what its replicas did not
	}
	m.store.failed(op, err)
}

// countInvalid counts the request of op as invalid when its answer, *err, is 400
// INVALID_ARGUMENT: its path, query or body was refused by the handler or by the engine. Each
// handler of an op defers it first, so that every way out is counted once.
func (m *metrics) countInvalid(op string, err *error) {
	if *err != nil && errorFor(*err).Code == CodeInvalidArgument {
		m.leaseOps.WithLabelValues(op, "invalid").Inc()
	}
}
