// jinja_ref.mjs: the reference side of tests/integration/itest_jinja.c.
// Renders every variable set of tests/data/jinja/matrix.json with
// @huggingface/jinja (the Jinja implementation transformers.js uses) and
// prints, as one JSON object on stdout, the templates it used and for each
// case its id, template, variables and output (or the error it raised).
// The C test renders the same variables with src/model/jinja and demands
// byte-identical output.
//
// usage: node jinja_ref.mjs MATRIX_JSON [NAME=TEMPLATE_FILE ...]
// Extra NAME=FILE templates (duplex's synthetic ones) are rendered over the
// conversations marked "plain", with the matrix's synthetic_vars.
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const matrix = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));

// tokenizer_config.json: chat_template is a string or a list of named
// templates ({name, template}); bos/eos are strings or {content: ...}.
function loadConfig(rel) {
  const cfg = JSON.parse(fs.readFileSync(path.join(here, "node_modules", rel), "utf8"));
  let tmpl = cfg.chat_template;
  if (Array.isArray(tmpl)) {
    const named = tmpl.find((t) => t.name === "default") ?? tmpl[0];
    tmpl = named.template;
  }
  const token = (t) => (t && typeof t === "object" ? t.content : t ?? null);
  return { source: tmpl, bos_token: token(cfg.bos_token), eos_token: token(cfg.eos_token) };
}

function render(source, vars) {
  try {
    return { output: new Template(source).render(vars) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
}

const templates = {};
const cases = [];

function addCase(id, name, vars) {
  // a deep copy, so that what is printed is exactly what was rendered
  const v = JSON.parse(JSON.stringify(vars));
  cases.push({ id, template: name, vars: v, ...render(templates[name], v) });
}

function withSystem(messages, sys) {
  return sys ? [matrix.system, ...messages] : messages;
}

for (const [name, rel] of Object.entries(matrix.templates)) {
  const cfg = loadConfig(rel);
  templates[name] = cfg.source;
  for (const [conv, spec] of Object.entries(matrix.conversations)) {
    for (const sys of [false, true]) {
      for (const tools of [false, true]) {
        for (const thinking of [undefined, true, false]) {
          for (const gen of [false, true]) {
            const vars = {
              messages: withSystem(spec.messages, sys),
              add_generation_prompt: gen,
              bos_token: cfg.bos_token,
              eos_token: cfg.eos_token,
            };
            if (tools) vars.tools = matrix.tools;
            if (thinking !== undefined) vars.enable_thinking = thinking;
            const id = [name, conv, sys ? "system" : "nosystem", tools ? "tools" : "notools",
              `thinking=${thinking ?? "absent"}`, `gen=${gen}`].join("/");
            addCase(id, name, vars);
          }
        }
      }
    }
  }
}

for (const arg of process.argv.slice(3)) {
  const eq = arg.indexOf("=");
  const name = arg.slice(0, eq);
  templates[name] = fs.readFileSync(arg.slice(eq + 1), "utf8");
  for (const [conv, spec] of Object.entries(matrix.conversations)) {
    if (!spec.plain) continue;
    for (const sys of [false, true]) {
      for (const gen of [false, true]) {
        const vars = { messages: withSystem(spec.messages, sys), add_generation_prompt: gen,
          ...matrix.synthetic_vars };
        addCase([name, conv, sys ? "system" : "nosystem", `gen=${gen}`].join("/"), name, vars);
      }
    }
  }
}

process.stdout.write(JSON.stringify({ templates, cases }));
