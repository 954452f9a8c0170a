package main

import (
	"log/slog"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/config"
)

// streamOptions are the event-stream settings of cfg. A ticket key that other instances cannot
// share is logged.
func streamOptions(cfg config.Config, log *slog.Logger) stream.Options {
	if cfg.RedisURL != "" && len(cfg.TicketSecret) == 0 && len(cfg.HS256Secret) == 0 {
		log.Warn("TABLEASE_TICKET_SECRET is not set and there is no TABLEASE_JWT_HS256_SECRET to derive it from: " +
			"event tickets are signed with a key of this process, so a ticket works only on the instance that issued it; " +
			"set the same TABLEASE_TICKET_SECRET on every instance")
	}
	return stream.Options{
		PerUser:      cfg.StreamsPerUser,
		PerInstance:  cfg.StreamsPerInstance,
		Keepalive:    cfg.StreamKeepalive,
		TicketSecret: cfg.TicketSecret,
	}
}
