package gateway

import (
	"fmt"
	"github.com/syncgate/syncgate/frames"
)

// maxBuildIDLen bounds a build id: the client's is kept for the session's
// life, and an admin-set one is sent to every session.
const maxBuildIDLen = 256

// BuildID returns the app build id the node currently announces (in its
// hello and in update-available frames).
func (s *Server) BuildID() string {
	s.buildMu.RLock()
	defer s.buildMu.RUnlock()
	return s.buildID
}

// SetBuildID makes id the current app build. Every session whose hello
// named a build other than id (both non-empty) is sent update-available
// {buildId: id}; later hellos are answered with id. Setting the current id
// again sends nothing. An id longer than a hello may carry (256 bytes, as
// Config.BuildID and the admin API) is refused with an error, and nothing
// changes.
func (s *Server) SetBuildID(id string) error {
	if len(id) > maxBuildIDLen {
		return fmt.Errorf("gateway: build id is %d bytes, over the limit of %d", len(id), maxBuildIDLen)
	}
	s.setBuildID(id)
	return nil
}

// setBuildID is SetBuildID; it returns how many sessions were told.
func (s *Server) setBuildID(id string) int {
	// buildMu is held across the whole change: a hello (which holds it
	// for reading while it answers) is either wholly before it, and told
	// here, or wholly after, and told by its own answer. Never both, never
	// neither.
	s.buildMu.Lock()
	defer s.buildMu.Unlock()
	if id == s.buildID {
		return 0
	}
	s.buildID = id
	s.log.Info("build id set", "buildId", id)
	if id == "" {
		return 0
	}
	b, err := frames.Encode(&frames.UpdateAvailable{BuildID: id})
	if err != nil {
		s.log.Error("encode failed", "type", frames.TypeUpdateAvailable, "err", err)
		return 0
	}
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	n := 0
	for _, sess := range sessions {
		// clientBuild and helloAnswered are guarded by buildMu.
		if sess.helloAnswered && sess.clientBuild != "" && sess.clientBuild != id {
			if sess.enqueue(outItem{body: b, kind: idxUpdateAvailable}) { // one encoding for all
				n++ // not a session already closing
			}
		}
	}
	return n
}

// answerHello queues the server's hello and, when the client runs another
// build than the node announces, update-available right after it.
func (s *session) answerHello(h *frames.Hello, clientBuild string) {
	s.srv.buildMu.RLock()
	defer s.srv.buildMu.RUnlock()
	build := s.srv.buildID
	s.clientBuild, s.helloAnswered = clientBuild, true
	h.BuildID = build
	s.send(h)
	if build != "" && clientBuild != "" && clientBuild != build {
		s.send(&frames.UpdateAvailable{BuildID: build})
	}
}
