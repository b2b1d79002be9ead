// Drive the Message Batches API of the official @anthropic-ai/sdk against a gateway and print
// one JSON line of what it saw (the Python test asserts on it).
// usage: node ts_batches.mjs BASE_URL MODEL BIG_PROMPT_REPEAT
//   1. create three small requests, poll until ended, retrieve, iterate the typed results;
//   2. create a batch of four slow requests (a long prompt each): delete it while it runs
//      (a 400), cancel it, wait for the end, iterate its results, delete it, retrieve (404);
//   3. list with limit 1 and after_id / before_id.
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, model, repeat] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "test-key", maxRetries: 0 });
const out = {};

function params(text) {
  return { model, max_tokens: 100, messages: [{ role: "user", content: text }] };
}

async function waitEnded(id) {
  const deadline = Date.now() + 90_000;
  for (;;) {
    const batch = await client.messages.batches.retrieve(id);
    if (batch.processing_status === "ended") return batch;
    if (Date.now() > deadline) throw new Error(`batch ${id} did not end: ${JSON.stringify(batch)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function results(id) {
  const got = [];
  for await (const line of await client.messages.batches.results(id)) {
    const r = { custom_id: line.custom_id, type: line.result.type };
    if (line.result.type === "succeeded") {
      r.stop_reason = line.result.message.stop_reason;
      r.texts = line.result.message.content.filter((b) => b.type === "text").map((b) => b.text);
    }
    got.push(r);
  }
  return got;
}

async function status(promise) {
  try {
    await promise;
    return null;
  } catch (err) {
    return { status: err.status ?? null, type: err.error?.error?.type ?? null };
  }
}

async function main() {
  const small = await client.messages.batches.create({
    requests: ["ts-a", "ts-b", "ts-c"].map((id) => ({ custom_id: id, params: params(`hello ${id}`) })),
  });
  out.created = small;
  out.ended = await waitEnded(small.id);
  out.retrieved = await client.messages.batches.retrieve(small.id);
  out.results = await results(small.id);

  const big = "lorem ipsum dolor sit amet ".repeat(Number(repeat));
  const slow = await client.messages.batches.create({
    requests: [0, 1, 2, 3].map((i) => ({ custom_id: `ts-slow-${i}`, params: params(`${i} ${big}`) })),
  });
  out.deleteRunning = await status(client.messages.batches.delete(slow.id));
  out.canceled = await client.messages.batches.cancel(slow.id);
  out.slowEnded = await waitEnded(slow.id);
  out.slowResults = await results(slow.id);
  out.deleted = await client.messages.batches.delete(slow.id);
  out.retrieveDeleted = await status(client.messages.batches.retrieve(slow.id));

  const third = await client.messages.batches.create({
    requests: [{ custom_id: "ts-d", params: params("hello ts-d") }],
  });
  await waitEnded(third.id);
  const page = await client.messages.batches.list({ limit: 1 });
  out.page1 = { ids: page.data.map((b) => b.id), has_more: page.has_more, first_id: page.first_id,
                last_id: page.last_id };
  const older = await client.messages.batches.list({ limit: 1, after_id: page.last_id });
  out.page2 = { ids: older.data.map((b) => b.id), has_more: older.has_more,
                first_id: older.first_id, last_id: older.last_id };
  const newer = await client.messages.batches.list({ limit: 1, before_id: older.first_id });
  out.page0 = { ids: newer.data.map((b) => b.id), has_more: newer.has_more };
  out.ids = { small: small.id, slow: slow.id, third: third.id };
}

main().then(
  () => { console.log(JSON.stringify(out)); },
  (err) => { console.log(JSON.stringify({ fatal: String(err), partial: out })); process.exitCode = 1; },
);
