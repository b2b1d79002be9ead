// Drive @anthropic-ai/sdk's stream helper and a buffered create with one request; print one
// JSON line: {"stream": finalMessage(), "created": create()} or {"fatal": ...}.
// usage: node ts_local.mjs BASE_URL REQUEST_JSON
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, requestJson] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "test-key", maxRetries: 0 });
const request = JSON.parse(requestJson);

async function main() {
  const stream = client.messages.stream(request);
  const events = [];
  stream.on("streamEvent", (event) => events.push(event.type));
  const final = await stream.finalMessage();
  const created = await client.messages.create(request);
  return { stream: final, created, events };
}

main().then(
  (out) => { console.log(JSON.stringify(out)); },
  (err) => { console.log(JSON.stringify({ fatal: String(err) })); process.exitCode = 1; },
);
