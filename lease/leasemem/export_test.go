package leasemem

// size is the number of entries.
func (e *Engine) size() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sessions)
}

// size is the number of nonces remembered.
func (s *NonceStore) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.used)
}
