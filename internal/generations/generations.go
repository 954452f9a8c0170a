// Package generations is a map whose memory is bounded by keeping two generations of entries:
// when the current one is full it becomes the previous one and the one before is dropped whole.
// A lookup that finds an entry in the previous generation moves it into the current one, so an
// entry in use survives; one left alone is forgotten within two generations. It suits caches whose
// entries may be forgotten at any time at the cost of redoing what they saved.
package generations

import "sync"

// Map is a two-generation map. The zero value is empty and ready; it is safe for concurrent use.
type Map[K comparable, V any] struct {
	mu       sync.Mutex
	cur, old map[K]V
}

// Get answers the value of k, if it is still kept, and moves it into the current generation.
func (m *Map[K, V]) Get(k K, perGeneration int) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.cur[k]; ok {
		return v, true
	}
	v, ok := m.old[k]
	if ok {
		delete(m.old, k)
		m.put(k, v, perGeneration)
	}
	return v, ok
}

// Put keeps v for k in the current generation, which becomes the previous one once it holds
// perGeneration entries: at most 2 × perGeneration entries are kept.
func (m *Map[K, V]) Put(k K, v V, perGeneration int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.old, k)
	m.put(k, v, perGeneration)
}

func (m *Map[K, V]) put(k K, v V, perGeneration int) {
	if _, ok := m.cur[k]; !ok && (m.cur == nil || len(m.cur) >= perGeneration) {
		m.old, m.cur = m.cur, make(map[K]V)
	}
	m.cur[k] = v
}

// Delete forgets k.
func (m *Map[K, V]) Delete(k K) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.cur, k)
	delete(m.old, k)
}

// Len is the number of entries kept.
func (m *Map[K, V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.cur) + len(m.old)
}
