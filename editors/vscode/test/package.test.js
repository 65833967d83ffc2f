// The extension's manifest: every file it names exists, the client starts `miles lsp`, and
// (when @vscode/vsce is installed) it packages into a .vsix.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const root = path.join(__dirname, '..');
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));

test('manifest points at files that exist', () => {
  assert.ok(fs.existsSync(path.join(root, pkg.main)));
  for (const l of pkg.contributes.languages) assert.ok(fs.existsSync(path.join(root, l.configuration)));
  for (const g of pkg.contributes.grammars) assert.ok(fs.existsSync(path.join(root, g.path)));
  JSON.parse(fs.readFileSync(path.join(root, 'language-configuration.json'), 'utf8'));
  assert.ok(pkg.activationEvents.includes('onLanguage:miles'));
});

test('the client starts `miles lsp`', () => {
  const src = fs.readFileSync(path.join(root, pkg.main), 'utf8');
  assert.match(src, /args: \['lsp'\]/);
});

test('packages into a .vsix', (t) => {
  const vsce = path.join(root, 'node_modules', '.bin', 'vsce');
  if (!fs.existsSync(vsce)) {
    t.skip('@vscode/vsce is not installed (npm ci installs it)');
    return;
  }
  const out = path.join(require('node:os').tmpdir(), `miles-${process.pid}.vsix`);
  execFileSync(vsce, ['package', '--allow-missing-repository', '--skip-license', '-o', out], { cwd: root, stdio: 'pipe' });
  const size = fs.statSync(out).size;
  fs.unlinkSync(out);
  assert.ok(size > 1000, `vsix of ${size} bytes`);
});
