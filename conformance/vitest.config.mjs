import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["conformance.test.mjs"],
    // The suite's tests assume vitest's default 5 s limit.
    testTimeout: 5000,
  },
})
