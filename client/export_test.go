package client

// TakeOverWaitForTest is takeOverWait, for the external tests' bounds.
const TakeOverWaitForTest = takeOverWait

// DroppingForTest reports whether a Drop of s has queued its drop and
// waits for the answer.
func (s *Subscription) DroppingForTest() bool {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.dropping
}

// DropWaitersForTest reports how many Drops of s wait for the outcome of
// another's drop.
func (s *Subscription) DropWaitersForTest() int {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return len(s.dropWait)
}

// SetDialedForTest makes Dial call f once its connection has said hello,
// before it becomes current, with the channel closed when that connection
// has ended.
func SetDialedForTest(o *Options, f func(ended <-chan struct{})) { o.dialedForTest = f }

// SetTakeOverForTest makes every take-over call f once it has added the
// subscriptions on the new connection, before it sends them there, with
// the channel closed when the new connection has ended.
func SetTakeOverForTest(o *Options, f func(ended <-chan struct{})) { o.takeOverForTest = f }
