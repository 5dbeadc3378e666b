package gateway

import "net/http"

// streamHandler serves the Durable Streams protocol over s.cfg.Log.
func (s *Server) streamHandler() http.Handler {
	return http.NotFoundHandler()
}
