package leaseredis

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// lastAudit answers the action of the newest record of the admins' audit log of user that the
// Redis of srv holds.
func lastAudit(t *testing.T, e *Engine, srv *redistest.Server, user string) string {
	t.Helper()
	msgs, err := srv.Client(t).XRevRangeN(t.Context(), e.adminAuditKey(user), "+", "-", 1).Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the audit log of %s on %s: %v, %v", user, srv.Addr(), msgs, err)
	}
	return msgs[0].Values["a"].(string)
}

// replicaOpTimeout is the OpTimeout of the engines whose revokes wait for replicas: WAIT gets
// three quarters of it, and a replica in sync on a machine busy with the other tests has taken
// more than the 750 ms that an OpTimeout of a second leaves.
const replicaOpTimeout = 3 * time.Second

func TestARevokeAnswersOnceItsReplicasConfirmIt(t *testing.T) {
	primary, replica := redistest.StartReplicated(t)
	engine := func() *Engine {
		client, err := NewClient(primary.URL(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		e, err := New(client, Options{OpTimeout: replicaOpTimeout, RevokeReplicas: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	e := engine()
	ctx := t.Context()
	if n, err := e.Replicas(ctx); err != nil || !maps.Equal(n, map[string]int{primary.Addr(): 1}) {
		t.Fatalf("Replicas = %v, %v; want 1 of %s", n, err, primary.Addr())
	}
	notReplicated := func(t *testing.T, what string, err error) {
		t.Helper()
		var re *lease.ReplicationError
		if !errors.As(err, &re) || re.Wanted != 1 || re.Acked != 0 || !errors.Is(err, lease.ErrUnavailable) {
			t.Fatalf("%s with the replica stopped: %v; want a ReplicationError of 0 replicas of 1", what, err)
		}
	}

	t.Run("a replica in sync confirms it before it answers", func(t *testing.T) {
		key := lease.Key{User: "ann", Session: "doc-1"}
		mustAcquire(t, e, key, tabA, lease.ModeTry)
		res, err := e.Revoke(ctx, lease.RevokeRequest{Key: key, Admin: "root", Reason: "r"})
		if err != nil || !res.Revoked {
			t.Fatalf("Revoke = %+v, %v; want revoked", res, err)
		}
		// No wait: WAIT confirmed that the replica has it.
		if a := lastAudit(t, e, replica, key.User); a != "revoke" {
			t.Fatalf("the replica's newest audit record of the user is %q, want the revoke", a)
		}
	})

	t.Run("a stopped replica does not, and the revoke stands on the primary", func(t *testing.T) {
		key := lease.Key{User: "bea", Session: "doc-1"}
		mustAcquire(t, e, key, tabA, lease.ModeTry)
		replica.Pause(t)
		req := lease.RevokeRequest{Key: key, Admin: "root", Reason: "r", RequestID: "req-1"}
		_, err := e.Revoke(ctx, req)
		notReplicated(t, "Revoke", err)
		// The error says what the revoke did on the primary, for the log.
		var re *lease.ReplicationError
		if errors.As(err, &re); re.Revoke == nil || !re.Revoke.Revoked || re.Revoke.Previous == nil || re.Revoke.Previous.TabID != "tab-a" {
			t.Fatalf("the ReplicationError's revoke = %+v, want tab-a revoked", re.Revoke)
		}
		if l, err := e.Get(ctx, key); err != nil || l.Held {
			t.Fatalf("Get after the revoke = %+v, %v; want the lease revoked on the primary", l, err)
		}
		// The retry of the same request replays the answer, and waits for it as the first did.
		_, err = e.Revoke(ctx, req)
		notReplicated(t, "the retry of the revoke", err)
		replica.Resume(t)
		res, err := e.Revoke(ctx, req)
		if err != nil || !res.Revoked || res.Previous == nil || res.Previous.TabID != "tab-a" {
			t.Fatalf("the retry with the replica back = %+v, %v; want the first answer: tab-a revoked", res, err)
		}
		if a := lastAudit(t, e, replica, key.User); a != "revoke" {
			t.Fatalf("the replica's newest audit record of the user is %q, want the revoke", a)
		}
	})

	t.Run("a driver's resend on a new connection waits for the call it resends", func(t *testing.T) {
		key := lease.Key{User: "cy", Session: "doc-1"}
		mustAcquire(t, e, key, tabA, lease.ModeTry)
		keys := e.sessionKeys(key, newReply(), keyName{nameAdminAudit, ""})
		args := []any{"root", "r", int64(0), "", lease.RevokeRetryWindow.Milliseconds()}
		replica.Pause(t)
		defer replica.Resume(t)
		_, err := e.revokeCall(ctx, "revoke", keys, args)
		notReplicated(t, "the revoke", err)
		// The same reply key, sent by another client (a connection that wrote nothing yet): Redis
		// answers from the key, and WAIT counts the replicas that have the replay's write, so the
		// stopped replica counts for neither.
		_, err = engine().revokeCall(ctx, "revoke", keys, args)
		notReplicated(t, "the resent revoke", err)
	})
}

func TestRevokeReplicasNeedsAClientThatNamesThePrimary(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := New(ring, Options{RevokeReplicas: 1}); err == nil || !strings.Contains(err.Error(), "RevokeReplicas") {
		t.Fatalf("New with a Ring and RevokeReplicas = %v, want an error naming RevokeReplicas", err)
	}
	var ie *lease.InvalidError
	if _, err := New(ring, Options{RevokeReplicas: -1}); !errors.As(err, &ie) || ie.Field != "RevokeReplicas" {
		t.Fatalf("New with RevokeReplicas -1 = %v, want an InvalidError of RevokeReplicas", err)
	}
}
