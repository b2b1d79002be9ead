// Drive the official @anthropic-ai/sdk through one web-search request, streamed and buffered,
// and print one JSON line: the stream's events as the SDK parsed them (its 'streamEvent'
// listener), its finalMessage(), and the buffered messages.create() reply.
// usage: node ts_web_search.mjs BASE_URL MODEL QUERY MAX_USES
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, query, maxUses] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "test-key", maxRetries: 0 });
const request = {
  model, max_tokens: 200, messages: [{ role: "user", content: query }],
  tools: [{ type: "web_search_20250305", name: "web_search", max_uses: Number(maxUses) }],
};
const out = { events: [] };

async function main() {
  const stream = client.messages.stream(request);
  stream.on("streamEvent", (event) => { out.events.push(event); });
  const blocks = [];
  stream.on("contentBlock", (block) => { blocks.push(block.type); });
  const final = await stream.finalMessage();
  out.stream = final;
  out.streamBlocks = blocks;
  out.finalText = await stream.finalText();
  out.created = await client.messages.create(request);
  out.createdKind = typeof out.created;
}

main().then(
  () => { console.log(JSON.stringify(out)); },
  (err) => { console.log(JSON.stringify({ fatal: String(err) })); process.exitCode = 1; },
);
