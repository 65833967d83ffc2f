// The Miles extension: highlighting comes from the TextMate grammar; everything else from the
// miles language server (`miles lsp`), started over stdio.
'use strict';

const vscode = require('vscode');
const { LanguageClient } = require('vscode-languageclient/node');

let client;

function activate(context) {
  const command = vscode.workspace.getConfiguration('miles').get('path') || 'miles';
  const serverOptions = { command, args: ['lsp'] };
  const clientOptions = {
    documentSelector: [
      { scheme: 'file', language: 'miles' },
      { scheme: 'untitled', language: 'miles' },
    ],
    synchronize: {
      fileEvents: vscode.workspace.createFileSystemWatcher('**/*.miles'),
    },
  };
  client = new LanguageClient('miles', 'Miles', serverOptions, clientOptions);
  context.subscriptions.push({ dispose: () => client && client.stop() });
  return client.start().catch((err) => {
    vscode.window.showErrorMessage(
      `Miles: could not start \`${command} lsp\` (${err.message}). Set "miles.path" to the miles binary.`
    );
  });
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
