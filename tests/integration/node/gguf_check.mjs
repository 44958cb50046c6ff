// Reads a GGUF file with Hugging Face's independent parser (@huggingface/gguf)
// and prints what it found as one JSON line: every metadata key with its
// scalar value (arrays as their length), and every tensor's name, shape,
// dtype and offset.  itest_gguf_interop compares this with duplex's reader.
import { gguf } from "@huggingface/gguf";

const { metadata, tensorInfos } = await gguf(process.argv[2], { allowLocalFile: true });
const meta = {};
for (const [k, v] of Object.entries(metadata)) {
  if (k === "version" || k === "tensor_count" || k === "kv_count") continue;
  meta[k] = Array.isArray(v) ? { len: v.length } : v;
}
const out = {
  version: metadata.version,
  meta,
  tensors: tensorInfos.map((t) => ({ name: t.name, shape: t.shape, dtype: t.dtype, offset: t.offset })),
};
console.log(JSON.stringify(out, (k, v) => (typeof v === "bigint" ? Number(v) : v)));
