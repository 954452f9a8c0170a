package leaseredis

// RenewWithFunctionsOnly makes e renew every lease with renew.lua, never with the live key
// (fastRenew): for tests whose store clock is not the one Redis expires keys by.
func RenewWithFunctionsOnly(e *Engine) { e.slowRenews = true }
