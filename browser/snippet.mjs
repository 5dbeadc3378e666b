// snippet.mjs runs the README's browser snippet in a real headless
// Chromium (Debian's /usr/bin/chromium, driven by playwright-core) against
// a gateway it starts on loopback. A browser sends an Origin, which Node's
// WebSocket does not, so this is where the gateway's Origin check meets
// what the README tells browser users:
//
//   - a page whose origin the gateway allows (-allowed-origins) receives
//     its own published message, and its socket ends normally;
//   - a page of any other origin is refused (HTTP 403 at the upgrade),
//     which the page sees as a socket closed with 1006 and nothing else.
//
// Usage: node snippet.mjs SYNCGATE_BIN SNIPPET_FILE
// Environment: CHROMIUM (default /usr/bin/chromium).
import { spawn } from "node:child_process";
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const [bin, snippetFile] = process.argv.slice(2);
if (!bin || !snippetFile) {
  console.error("usage: node snippet.mjs SYNCGATE_BIN SNIPPET_FILE");
  process.exit(2);
}
const deadlineMs = 20000; // for each page; the whole run is bounded by the caller too

// Pages are served from two origins on loopback: one allowed, one not.
// html is called per request: the gateway's address comes later.
function pageServer(html) {
  const srv = http.createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    res.end(html());
  });
  return new Promise((resolve) => srv.listen(0, "127.0.0.1", () => resolve(srv)));
}

// The gateway on a port of its own choosing, read from its first line.
function startGateway(allowedOrigin) {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "syncgate-browser-"));
  const gw = spawn(bin, ["-addr", "127.0.0.1:0", "-data-dir", dataDir, "-log-level", process.env.SNIPPET_LOG_LEVEL || "warn",
    "-allowed-origins", allowedOrigin], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error("the gateway did not say where it listens within 10s")), 10000);
    gw.on("exit", (code) => reject(new Error(`the gateway exited (${code}) before listening`)));
    gw.stdout.on("data", (chunk) => {
      out += chunk;
      const m = out.match(/listening on http:\/\/(127\.0\.0\.1:\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({ gw, addr: m[1], dataDir });
      }
    });
  });
}

// Opens url and returns what the page logged, until it logs "closed" or
// the deadline passes.
async function run(browser, url) {
  const page = await browser.newPage();
  const logs = [];
  let closed;
  const done = new Promise((resolve) => { closed = resolve; });
  page.on("pageerror", (err) => logs.push(["pageerror", String(err)]));
  page.on("console", async (msg) => {
    const args = await Promise.all(msg.args().map((a) => a.jsonValue().catch(() => undefined)));
    logs.push(args.length ? args : ["console", msg.text()]);
    if (args[0] === "closed") closed();
  });
  await page.goto(url);
  const timer = new Promise((resolve) => setTimeout(resolve, deadlineMs));
  await Promise.race([done, timer]);
  await page.close();
  return logs;
}

const received = (logs) =>
  logs.some(([lsn, data]) => typeof lsn === "string" && /^\d{16}_\d{16}$/.test(lsn) && data && data.text === "hi");
const closeCode = (logs) => logs.find(([first]) => first === "closed")?.[1];
// Chromium logs a refused handshake itself, with the HTTP status.
const refusedWith = (logs, status) =>
  logs.some(([first, text]) => first === "console" && String(text).includes(`Unexpected response code: ${status}`));

let gateway;
let browser;
// Stopped from outside (the caller's timeout): the gateway goes too.
process.on("SIGTERM", () => {
  gateway?.gw.kill("SIGKILL");
  process.exit(1);
});
const servers = [];
let failed = false;
try {
  const snippet = fs.readFileSync(snippetFile, "utf8");
  const page = (gatewayURL) => `<!doctype html><meta charset="utf-8"><title>syncgate snippet</title>
<script type="module">
${snippet.replace("ws://127.0.0.1:8080", gatewayURL)}
ws.addEventListener("close", (e) => console.log("closed", e.code));
setTimeout(() => ws.close(), 1500);
</script>`;
  // The page servers first (their ports name the allowed origin), with the
  // gateway's address filled in once it listens.
  let gatewayURL = "";
  const allowed = await pageServer(() => page(gatewayURL));
  const other = await pageServer(() => page(gatewayURL));
  servers.push(allowed, other);
  const allowedOrigin = `127.0.0.1:${allowed.address().port}`;
  gateway = await startGateway(allowedOrigin);
  gatewayURL = `ws://${gateway.addr}`;

  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"], // as root in a container, Chromium's sandbox cannot start
    timeout: 30000,
  });

  const ok = await run(browser, `http://${allowedOrigin}/`);
  if (!received(ok) || closeCode(ok) !== 1005) {
    failed = true;
    console.error(`snippet (allowed origin): want the message { text: 'hi' } and close 1005, got ${JSON.stringify(ok)}`);
  } else {
    console.log(`snippet (allowed origin ${allowedOrigin}): received its message, closed ${closeCode(ok)}`);
  }
  const refused = await run(browser, `http://127.0.0.1:${other.address().port}/`);
  if (received(refused) || closeCode(refused) !== 1006 || !refusedWith(refused, 403)) {
    failed = true;
    console.error(`snippet (other origin): want the handshake refused with 403, no message and close 1006, got ${JSON.stringify(refused)}`);
  } else {
    console.log("snippet (other origin): refused with 403, closed 1006");
  }
} catch (err) {
  failed = true;
  console.error("snippet:", err);
} finally {
  if (browser) await browser.close();
  for (const s of servers) s.close();
  if (gateway) {
    gateway.gw.kill("SIGTERM");
    fs.rmSync(gateway.dataDir, { recursive: true, force: true });
  }
}
process.exit(failed ? 1 : 0);
