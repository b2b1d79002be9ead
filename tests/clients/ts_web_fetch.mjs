// Drive the official @anthropic-ai/sdk through one web-fetch request, streamed and buffered,
// and print one JSON line: the stream's events as the SDK parsed them (its 'streamEvent'
// listener), its finalMessage(), and the buffered messages.create() reply.
// usage: node ts_web_fetch.mjs BASE_URL MODEL TEXT TOOL_JSON
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, text, toolJson] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "test-key", maxRetries: 0 });
const request = {
  model, max_tokens: 200, messages: [{ role: "user", content: text }],
  tools: [JSON.parse(toolJson)],
};
const out = { events: [] };

async function main() {
  const stream = client.messages.stream(request);
  stream.on("streamEvent", (event) => { out.events.push(event); });
  const blocks = [];
  stream.on("contentBlock", (block) => { blocks.push(block.type); });
  out.stream = await stream.finalMessage();
  out.streamBlocks = blocks;
  out.created = await client.messages.create(request);
  out.createdKind = typeof out.created;
}

main().then(
  () => { console.log(JSON.stringify(out)); },
  (err) => { console.log(JSON.stringify({ fatal: String(err) })); process.exitCode = 1; },
);
