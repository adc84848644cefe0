// Chat with a chat bundle's decoder in Node through the bundle's own chat.js, ort/ and lib/
// files: the check `ferry export --target web` makes of a generative artifact before publishing
// it (``ferry.web._chat``). Not shipped in bundles.
//
// usage: node _run_chat.mjs BUNDLE_DIR REQUEST.json RESULT.json
//   REQUEST: {messages, max_new_tokens, options?: chat.generate's}; RESULT: {prompt_text, prompt_ids, ids, text,
//   streamed (the text of each token as the page showed it),
//   finish_reason, prefill_ms, tokens_per_second, backend}. Errors: one line on stderr, exit 1.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [bundle, requestFile, resultFile] = process.argv.slice(2);
try {
  const { loadChat } = await import(pathToFileURL(path.join(bundle, 'chat.js')).href);
  const read = async (name, kind) => {
    const bytes = fs.readFileSync(path.join(bundle, name));
    return kind === 'json' ? JSON.parse(bytes.toString('utf8')) : new Uint8Array(bytes);
  };
  const chat = await loadChat({ backend: 'wasm', threads: 1, read });
  const request = JSON.parse(fs.readFileSync(requestFile, 'utf8'));
  const promptIds = chat.encode(request.messages);
  const pieces = [];
  const out = await chat.generate(promptIds, {
    ...(request.options || {}),
    maxNewTokens: request.max_new_tokens,
    onToken: (t) => pieces.push(t.text),
  });
  fs.writeFileSync(resultFile, JSON.stringify({
    prompt_text: chat.render(request.messages),
    prompt_ids: promptIds,
    ids: out.ids,
    text: out.text,
    streamed: pieces,
    finish_reason: out.finishReason,
    prefill_ms: out.prefillMs,
    tokens_per_second: out.tokensPerSecond,
    backend: chat.backend,
  }));
  await chat.release();
  process.exit(0);
} catch (e) {
  process.stderr.write(String(e && e.message ? e.message : e).replace(/\s+/g, ' ') + '\n');
  process.exit(1);
}
