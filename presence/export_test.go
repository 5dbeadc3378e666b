package presence

// TopicsForTest returns how many topics r remembers.
func TopicsForTest(r *MemoryRegistry) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.topics)
}
