package api

// size is the number of buckets kept.
func (u *userLimiter) size() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lru.Len()
}
