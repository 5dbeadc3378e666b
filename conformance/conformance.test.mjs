// The Durable Streams server conformance suite, run against a live
// syncgate. scripts/conformance.sh starts the server and sets
// CONFORMANCE_BASE_URL; the package's own CLI cannot be used from
// node_modules (vitest excludes files there).
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_BASE_URL
if (!baseUrl) {
  throw new Error(
    "CONFORMANCE_BASE_URL is not set: run scripts/conformance.sh, or set it to a running server (e.g. http://127.0.0.1:8080)",
  )
}

runConformanceTests({
  baseUrl,
  // The server's long-poll timeout; the suite allows it plus 1 s in the
  // tests that wait one out.
  longPollTimeoutMs: Number(process.env.CONFORMANCE_LONG_POLL_TIMEOUT_MS ?? "500"),
})
