// The TextMate grammar, tokenised the way VS Code does it (vscode-textmate + oniguruma).
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const vsctm = require('vscode-textmate');
const oniguruma = require('vscode-oniguruma');

const root = path.join(__dirname, '..');

async function registry() {
  const wasm = fs.readFileSync(path.join(path.dirname(require.resolve('vscode-oniguruma')), 'onig.wasm'));
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.byteLength));
  return new vsctm.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (p) => new oniguruma.OnigScanner(p),
      createOnigString: (s) => new oniguruma.OnigString(s),
    }),
    loadGrammar: async (scope) => {
      if (scope !== 'source.miles') return null;
      const file = path.join(root, 'syntaxes', 'miles.tmLanguage.json');
      return vsctm.parseRawGrammar(fs.readFileSync(file, 'utf8'), file);
    },
  });
}

let grammarPromise;
function grammar() {
  grammarPromise = grammarPromise || registry().then((r) => r.loadGrammar('source.miles'));
  return grammarPromise;
}

/** Every token of a text as [text, innermost scope]. */
async function tokens(text) {
  const g = await grammar();
  let state = vsctm.INITIAL;
  const out = [];
  for (const line of text.split('\n')) {
    const r = g.tokenizeLine(line, state);
    for (const t of r.tokens) {
      const s = line.slice(t.startIndex, t.endIndex);
      if (s.trim() !== '') out.push([s.trim(), t.scopes[t.scopes.length - 1]]);
    }
    state = r.ruleStack;
  }
  return out;
}

function scopeOf(toks, text) {
  const t = toks.find(([s]) => s === text);
  assert.ok(t, `no token ${JSON.stringify(text)} in ${JSON.stringify(toks)}`);
  return t[1];
}

test('items, names and keywords', async () => {
  const t = await tokens('import std/tasks/arith as a\nschema opts is Prompts {\nstage grpo(rollout: Trajectories) -> Policy {\nrecipe fast extends base on laptop {\nmodel policy = transformer {}');
  assert.strictEqual(scopeOf(t, 'import'), 'keyword.control.import.miles');
  assert.strictEqual(scopeOf(t, 'std/tasks/arith'), 'entity.name.namespace.miles');
  assert.strictEqual(scopeOf(t, 'opts'), 'entity.name.type.miles');
  assert.strictEqual(scopeOf(t, 'grpo'), 'entity.name.function.miles');
  assert.strictEqual(scopeOf(t, 'Trajectories'), 'support.type.miles');
  assert.strictEqual(scopeOf(t, 'fast'), 'entity.name.function.miles');
  assert.strictEqual(scopeOf(t, 'extends'), 'keyword.other.miles');
  assert.strictEqual(scopeOf(t, 'laptop'), 'variable.other.constant.miles');
  assert.strictEqual(scopeOf(t, 'policy'), 'variable.other.constant.miles');
});

test('numbers with units, strings, comments', async () => {
  const t = await tokens('const x = 80.GB / 900.GB/s + 1_000 + 8k + 1e-6 // note\n/// Doc comment\ncheck a else "msg \\" here" help "fix"');
  assert.strictEqual(scopeOf(t, '80'), 'constant.numeric.miles');
  assert.strictEqual(scopeOf(t, 'GB'), 'keyword.other.unit.miles');
  assert.strictEqual(scopeOf(t, 'GB/s'), 'keyword.other.unit.miles');
  assert.strictEqual(scopeOf(t, '1_000'), 'constant.numeric.miles');
  assert.strictEqual(scopeOf(t, '8k'), 'constant.numeric.miles');
  assert.strictEqual(scopeOf(t, '1e-6'), 'constant.numeric.miles');
  assert.strictEqual(scopeOf(t, '// note'), 'comment.line.double-slash.miles');
  assert.strictEqual(scopeOf(t, '/// Doc comment'), 'comment.line.documentation.miles');
  assert.strictEqual(scopeOf(t, 'check'), 'keyword.control.miles');
  assert.strictEqual(scopeOf(t, '\\"'), 'constant.character.escape.miles');
  assert.strictEqual(scopeOf(t, 'help'), 'keyword.control.miles');
});

test('fields, operators and literals', async () => {
  const t = await tokens('    samples_per_prompt: Int in 1.. = 8\n    session: tito? = none\n    sync = weights(train -> rollout)\n    x = min(a, b) and not true');
  assert.strictEqual(scopeOf(t, 'samples_per_prompt'), 'variable.other.property.miles');
  assert.strictEqual(scopeOf(t, 'in'), 'keyword.operator.word.miles');
  assert.strictEqual(scopeOf(t, '..'), 'keyword.operator.range.miles');
  assert.strictEqual(scopeOf(t, '?'), 'keyword.operator.optional.miles');
  assert.strictEqual(scopeOf(t, 'none'), 'constant.language.miles');
  assert.strictEqual(scopeOf(t, '->'), 'keyword.operator.arrow.miles');
  assert.strictEqual(scopeOf(t, 'min'), 'support.function.builtin.miles');
  assert.strictEqual(scopeOf(t, 'true'), 'constant.language.miles');
});

test('every shipped recipe and stdlib file tokenises without error', async () => {
  const repo = path.join(root, '..', '..');
  const files = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (p.endsWith('.miles')) files.push(p);
    }
  };
  walk(path.join(repo, 'stdlib'));
  walk(path.join(repo, 'recipes'));
  assert.ok(files.length >= 6);
  for (const f of files) {
    const t = await tokens(fs.readFileSync(f, 'utf8'));
    assert.ok(t.length > 0, f);
    // Strings never run past their line: no token of a later line is in a string scope
    // unless it starts with a quote.
    assert.ok(!t.some(([s, scope]) => scope === 'string.quoted.double.miles' && s.includes('\n')), f);
  }
});
