package main

import (
	"log/slog"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/config"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// streamsOf wires the event stream: the engine's Feed, Presence and Nonces (found by type
// assertion), a nonce store of this process beside the memory engine, and
// the stream settings of cfg. What the engine lacks is logged: the routes that need it answer 404.
func streamsOf(engine lease.Engine, cfg config.Config, log *slog.Logger) (lease.Feed, lease.Presence, lease.Nonces, stream.Options) {
	feed, _ := engine.(lease.Feed)
	presence, _ := engine.(lease.Presence)
	nonces, _ := engine.(lease.Nonces)
	if nonces == nil {
		nonces = leasemem.NewNonceStore(nil) // one instance: the memory engine
	}
	if feed == nil {
		log.Warn("the lease engine has no event feed yet: GET /v1/sessions/{sid}/events and POST …/events/ticket answer 404")
	}
	if presence == nil {
		log.Warn("the lease engine has no presence yet: GET /v1/sessions/{sid}/tabs answers 404")
	}
	if feed != nil && cfg.RedisURL != "" && len(cfg.TicketSecret) == 0 && len(cfg.HS256Secret) == 0 {
		log.Warn("TABLEASE_TICKET_SECRET is not set and there is no TABLEASE_JWT_HS256_SECRET to derive it from: " +
			"event tickets are signed with a key of this process, so a ticket works only on the instance that issued it; " +
			"set the same TABLEASE_TICKET_SECRET on every instance")
	}
	return feed, presence, nonces, stream.Options{
		PerUser:      cfg.StreamsPerUser,
		PerInstance:  cfg.StreamsPerInstance,
		Keepalive:    cfg.StreamKeepalive,
		TicketSecret: cfg.TicketSecret,
	}
}
