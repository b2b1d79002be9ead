// Drive the official @anthropic-ai/sdk against a gateway and print one JSON line of results.
// usage: node ts_sdk.mjs BASE_URL MODEL MODE      (MODE: ok | stream-error)
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "test-key", maxRetries: 0 });
const messages = [{ role: "user", content: "hi" }];
const thinking = { type: "adaptive" };  // the gateway shows thinking only when asked
const out = {};

async function main() {
  if (mode === "stream-error") {
    try {
      await client.messages.stream({ model, max_tokens: 100, messages }).finalMessage();
      out.error = null;
    } catch (err) {
      out.error = { name: err.constructor.name, type: err.type ?? err.error?.error?.type ?? null,
                    message: String(err.message).slice(0, 300) };
    }
    return;
  }
  const stream = client.messages.stream({ model, max_tokens: 200, messages, thinking });
  const final = await stream.finalMessage();
  out.stream = { content: final.content, stop_reason: final.stop_reason, usage: final.usage };
  out.finalText = await stream.finalText();
  const created = await client.messages.create({ model, max_tokens: 200, messages, thinking });
  out.created = { kind: typeof created, content: created.content, stop_reason: created.stop_reason,
                  usage: created.usage };
  out.models = [];
  for await (const m of client.models.list()) out.models.push(m.id);
  out.count = (await client.messages.countTokens({ model, messages, thinking })).input_tokens;
}

main().then(
  () => { console.log(JSON.stringify(out)); },
  (err) => { console.log(JSON.stringify({ fatal: String(err) })); process.exitCode = 1; },
);
