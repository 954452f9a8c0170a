// Package owner holds the ownership rules of tablease that sit between the lease domain and the
// HTTP API: which role a tab has, which tools it may register, how a lease is proven to someone
// who is not tablease, and how an application backend refuses mutations from a tab that does not
// hold the lease.
//
// The package itself defines [Role] and [RoleFor]. The rest lives in subpackages, which import
// the standard library, the lease package, golang-jwt and small internal helpers (guardecho: Echo
// too), nothing of the server:
//
//   - [github.com/tablease/tablease/owner/catalog]: the tool catalog (MCP-style tools with
//     annotations and route profiles), its parsing, versioning and the per-role, per-route view a
//     tab receives.
//   - [github.com/tablease/tablease/owner/leasetoken]: lease tokens, the JWTs tablease signs for
//     the holder of a lease (claims iss, sub, sid, tab, epoch, iat, exp), the signing keys, their
//     rotation and the JWKS that publishes them.
//   - [github.com/tablease/tablease/owner/guard]: what an application backend imports to protect
//     its mutations: net/http middleware that verifies the lease token offline against tablease's
//     JWKS, checks that it names the user and session the request touches, optionally asks
//     tablease whether the epoch is still current, and hands the epoch to the handler for fencing.
//     guard/guardecho adapts it to Echo v4.
//
// Safety comes from the epoch, not from the TTL: a backend that accepts writes on a tab's behalf
// keeps the highest epoch it has seen per resource and refuses lower ones (docs/fencing.md).
package owner
