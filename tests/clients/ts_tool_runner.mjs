// Run the TypeScript SDK's default tool runner (client.beta.messages.toolRunner) against a gateway
// and print one JSON line: the final message, the tool's calls and every request the SDK sent.
// usage: node ts_tool_runner.mjs BASE_URL MODEL [stream]
import Anthropic from "@anthropic-ai/sdk";
import { betaTool } from "@anthropic-ai/sdk/helpers/beta/json-schema";

const [baseURL, model, mode] = process.argv.slice(2);
const sent = []; // each request as the SDK sent it: the thread fallback is visible here
const client = new Anthropic({
  baseURL, apiKey: "test-key", maxRetries: 0,
  fetch: async (url, init) => {
    const response = await fetch(url, init);
    sent.push({ url: String(url), status: response.status,
                beta: new Headers(init?.headers).get("anthropic-beta"),
                body: typeof init?.body === "string" ? JSON.parse(init.body) : null });
    return response;
  },
});
const calls = [];
const getWeather = betaTool({
  name: "get_weather",
  description: "The current weather in a city",
  inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  run: async ({ city }) => {
    calls.push(city);
    return `Sunny and 21 C in ${city}`;
  },
});

async function main() {
  // default settings: no `thread: false`, so the SDK starts a message thread
  const runner = client.beta.messages.toolRunner({
    model, max_tokens: 200, tools: [getWeather], stream: mode === "stream",
    messages: [{ role: "user", content: "What is the weather in Paris?" }],
  });
  const final = await runner.runUntilDone();
  return { final: { content: final.content, stop_reason: final.stop_reason }, calls, sent };
}

main().then(
  (out) => { console.log(JSON.stringify(out)); },
  (err) => {
    console.log(JSON.stringify({ fatal: String(err), status: err.status ?? null,
                                 error: err.error ?? null, calls, sent }));
    process.exitCode = 1;
  },
);
