package fanout

import "fmt"

// CheckIndex reports whether topic's index agrees with its list: nil, or
// one entry per subscriber holding its position. For tests.
func CheckIndex(h *Hub, topic string) error {
	sh := h.shard(topic)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	ts := sh.topics[topic]
	switch {
	case ts == nil:
		return nil
	case len(ts.list) == 0:
		return fmt.Errorf("topic %q has an entry but no subscribers", topic)
	case ts.pos == nil:
		if len(ts.list) > indexAbove {
			return fmt.Errorf("topic %q has %d subscribers and no index", topic, len(ts.list))
		}
		return nil
	case len(ts.pos) != len(ts.list):
		return fmt.Errorf("index has %d entries, list %d", len(ts.pos), len(ts.list))
	}
	for i, s := range ts.list {
		if j, ok := ts.pos[s]; !ok || j != i {
			return fmt.Errorf("list[%d] indexed at %d (present %v)", i, j, ok)
		}
	}
	return nil
}

// Indexed reports whether topic currently has an index. For tests.
func Indexed(h *Hub, topic string) bool {
	sh := h.shard(topic)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	ts := sh.topics[topic]
	return ts != nil && ts.pos != nil
}
