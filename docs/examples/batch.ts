// A complete batch workflow with the official `openai` npm package (docs/GUIDE.md).
// Run it from a directory of its own, with both packages installed beside it:
//   mkdir batch-ts && cp docs/examples/batch.ts batch-ts/ && cd batch-ts
//   npm install openai@6 tsx@4
//   BOARDWALK_BASE_URL=http://127.0.0.1:8000/v1 BOARDWALK_API_KEY=bw_... \
//     npx tsx batch.ts requests.jsonl [OUT_DIR]
import fs from "node:fs";
import path from "node:path";
import OpenAI, { toFile } from "openai";

const TERMINAL = new Set(["completed", "failed", "cancelled", "expired"]);

async function download(client: OpenAI, fileId: string, dest: string): Promise<void> {
  // Resume `dest.part` from where it stopped, unless the file changed since (If-Range).
  const part = `${dest}.part`;
  const etagFile = `${dest}.etag`;
  const headers: Record<string, string> = {};
  if (fs.existsSync(part) && fs.existsSync(etagFile)) {
    headers["Range"] = `bytes=${fs.statSync(part).size}-`;
    headers["If-Range"] = fs.readFileSync(etagFile, "utf8");
  }
  const response = await client.files.content(fileId, { headers });
  fs.writeFileSync(etagFile, response.headers.get("etag") ?? "");
  const bytes = Buffer.from(await response.arrayBuffer());
  if (response.status === 206) fs.appendFileSync(part, bytes);
  else fs.writeFileSync(part, bytes);
  fs.renameSync(part, dest);
  fs.unlinkSync(etagFile);
}

async function main(): Promise<number> {
  const [requestsPath, outDir = "."] = process.argv.slice(2);
  const client = new OpenAI({
    baseURL: process.env.BOARDWALK_BASE_URL ?? "http://127.0.0.1:8000/v1",
    apiKey: process.env.BOARDWALK_API_KEY,
  });
  const file = await client.files.create({
    file: await toFile(fs.readFileSync(requestsPath), path.basename(requestsPath)),
    purpose: "batch",
  });
  const body = {
    input_file_id: file.id,
    endpoint: "/v1/chat/completions" as const,
    completion_window: "24h" as const,
  };
  console.log("estimate:", JSON.stringify(await client.post("/batches/estimate", { body })));
  // The key is derived from the upload: a retried create answers the same batch.
  let batch = await client.batches.create(body, {
    headers: { "Idempotency-Key": `create-${file.id}` },
  });
  let delay = 1000;
  while (!TERMINAL.has(batch.status)) {
    await new Promise((resolve) => setTimeout(resolve, delay));
    delay = Math.min(delay * 2, 30_000);
    batch = await client.batches.retrieve(batch.id);
    const counts = batch.request_counts;
    console.log(`${batch.status}: ${counts?.completed}/${counts?.total}`);
  }
  console.log("batch", batch.id, batch.status);
  const seen = new Set<string>();
  const stem = path.basename(requestsPath, ".jsonl");
  for (const [kind, fileId] of [
    ["results", batch.output_file_id],
    ["errors", batch.error_file_id], // null when nothing failed
  ] as const) {
    if (!fileId) continue;
    const dest = path.join(outDir, `${stem}.${kind}.jsonl`);
    await download(client, fileId, dest);
    const rows = fs.readFileSync(dest, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
    rows.forEach((row) => seen.add(row.custom_id));
    console.log(`${kind}: ${dest} (${rows.length} rows)`);
  }
  const wanted = fs.readFileSync(requestsPath, "utf8").split("\n").filter(Boolean)
    .map((l) => JSON.parse(l).custom_id as string);
  const missing = wanted.filter((id) => !seen.has(id));
  console.log("no row:", JSON.stringify(missing));
  return missing.length ? 1 : 0;
}

main().then((code) => process.exit(code), (error) => {
  console.error(error);
  process.exit(2);
});
