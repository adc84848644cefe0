// chat.js: chat with the bundle's decoder in the page (or in Node), on onnxruntime-web.
//
//   import { loadChat } from './chat.js';
//   const chat = await loadChat({ backend: 'auto' });       // files beside this module
//   const ids = chat.encode([{ role: 'user', content: 'Hi!' }]);  // the chat template, tokenized
//   const out = await chat.generate(ids, { maxNewTokens: 64, onToken: (t) => show(t.text) });
//   out.ids, out.text, out.finishReason, out.tokensPerSecond
//
// The token loop is ferry's Python one (ferry.generate.DecoderSession): the prompt runs once
// (prefill), then one token per step with the key/value cache of every layer handed back; greedy
// unless a temperature is given; text decoded from all new ids at each step, a trailing partial
// UTF-8 character (U+FFFD) held back until the token completing it comes. Written by
// `ferry export --target web` from a generative artifact; ./ort/ holds onnxruntime-web, ./lib/
// the tokenizer (@huggingface/tokenizers) and the Jinja engine (@huggingface/jinja) from npm.
import * as ort from './ort/__ORT_ENTRY__';
import { Tokenizer } from './lib/tokenizers.mjs';
import { Template } from './lib/jinja.mjs';

export const ORT_WEB_VERSION = '__ORT_VERSION__';
const PARTIAL = '\ufffd';

function message(e) {
  return e && e.message ? e.message : String(e);
}

// Reads a bundle file: in a page by fetch (with download progress), in Node through `read`.
function fetchReader(base) {
  return async (name, kind, onProgress) => {
    const url = new URL(name, base).href;
    let response;
    try {
      response = await fetch(url);
    } catch (e) {
      throw new Error(`ferry: cannot fetch ${url}: ${message(e)}`);
    }
    if (!response.ok) {
      throw new Error(`ferry: cannot fetch ${url}: HTTP ${response.status} ${response.statusText}`);
    }
    if (kind === 'json') return response.json();
    const total = Number(response.headers.get('content-length')) || 0;
    // A compressed response announces its compressed size: no progress for it.
    if (!response.body || !total || response.headers.get('content-encoding')) {
      return new Uint8Array(await response.arrayBuffer());
    }
    // One buffer of the announced size, filled as the chunks come: a 140 MB download shows
    // progress and is never held twice.
    const bytes = new Uint8Array(total);
    const reader = response.body.getReader();
    let at = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      if (at + value.length > total) throw new Error(`ferry: ${url} is longer than announced`);
      bytes.set(value, at);
      at += value.length;
      if (onProgress) onProgress(name, at, total);
    }
    if (at !== total) throw new Error(`ferry: ${url} was cut short (${at} of ${total} bytes)`);
    return bytes;
  };
}

async function webgpuAdapter() {
  const gpu = globalThis.navigator && navigator.gpu;
  if (!gpu) return null;
  try {
    return await gpu.requestAdapter();
  } catch {
    return null;
  }
}

let configuredThreads = null;

// onnxruntime-web reads env when its first session is created: configured once per page.
function configure(threads) {
  if (configuredThreads !== null) return configuredThreads;
  ort.env.wasm.wasmPaths = new URL('./ort/', import.meta.url).href;
  // Threads need SharedArrayBuffer, which browsers give only to cross-origin isolated pages.
  const isolated = globalThis.crossOriginIsolated === true;
  const cores = (globalThis.navigator && navigator.hardwareConcurrency) || 1;
  let n = threads == null ? (isolated ? cores : 1) : Math.max(1, Math.floor(Number(threads)));
  if (!isolated && n > 1 && typeof window !== 'undefined') n = 1;
  ort.env.wasm.numThreads = n;
  configuredThreads = n;
  return n;
}

/**
 * Load the bundle's decoder, tokenizer and chat template.
 *
 * @param {{backend?: 'auto'|'wasm'|'webgpu', threads?: number, base?: string|URL,
 *          read?: (name: string, kind: 'json'|'bytes') => Promise<any>,
 *          onProgress?: (file: string, loaded: number, total: number) => void}} [options]
 *   backend: 'auto' (default) takes WebGPU when the browser offers an adapter and the model
 *   loads there, else wasm; threads: wasm threads (default: every core when cross-origin
 *   isolated, else 1); base: the bundle's URL (default: this module's folder); read: how files
 *   are read (Node passes one; pages fetch).
 * @returns {Promise<Chat>}
 */
export async function loadChat(options = {}) {
  const known = ['backend', 'threads', 'base', 'read', 'onProgress'];
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) throw new Error(`ferry: unknown option ${key}; known: ${known.join(', ')}`);
  }
  const wanted = options.backend || 'auto';
  if (!['auto', 'wasm', 'webgpu'].includes(wanted)) {
    throw new Error(`ferry: unknown backend ${wanted}; use 'auto', 'wasm' or 'webgpu'`);
  }
  const read = options.read || fetchReader(options.base || new URL('./', import.meta.url));
  const manifest = await read('manifest.json', 'json');
  const decoder = manifest.decoder;
  const [tokenizerJson, tokenizerConfig] = await Promise.all([
    read(decoder.tokenizer, 'json'),
    read(decoder.tokenizer_config, 'json'),
  ]);
  const tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
  const template = new Template(decoder.chat_template);
  const threads = configure(options.threads);
  const model = await read(manifest.model.file, 'bytes', options.onProgress);
  const externalData = [];
  for (const path of decoder.external_data) {
    externalData.push({ path, data: await read(path, 'bytes', options.onProgress) });
  }
  const adapter = wanted === 'wasm' ? null : await webgpuAdapter();
  if (wanted === 'webgpu' && !adapter) {
    throw new Error('ferry: backend webgpu failed: this browser offers no WebGPU adapter; use backend wasm');
  }
  const create = (backend) => {
    const sessionOptions = {
      executionProviders: [backend],
      externalData,
      // No QDQ fusion: constant folding then dequantizes each DequantizeLinear weight once, at
      // load (float32 in memory), where the fused MatMulNBits would dequantize it at every step
      // (onnxruntime-web has no block-quantized matmul kernel: measured 28 vs 1 tokens/s).
      extra: { session: { disable_quant_qdq: '1' } },
    };
    if (backend === 'webgpu') {
      // The cache stays on the GPU between steps; only the logits come back.
      sessionOptions.preferredOutputLocation = Object.fromEntries(
        decoder.present.map((name) => [name, 'gpu-buffer']),
      );
    }
    return ort.InferenceSession.create(model, sessionOptions);
  };
  let backend = adapter ? 'webgpu' : 'wasm';
  let session;
  try {
    session = await create(backend);
  } catch (e) {
    if (backend !== 'webgpu' || wanted === 'webgpu') {
      throw new Error(`ferry: backend ${backend} failed to load the model: ${message(e)}`);
    }
    // An adapter without a kernel the graph needs, or one that misbehaves: wasm runs it all.
    console.warn(`ferry: WebGPU failed to load the model (${message(e)}); running on wasm`);
    backend = 'wasm';
    try {
      session = await create(backend);
    } catch (e2) {
      throw new Error(`ferry: backend wasm failed to load the model: ${message(e2)}`);
    }
  }
  return new Chat(session, tokenizer, template, tokenizerConfig, manifest, backend, threads);
}

// A small seeded generator (mulberry32): the same seed gives the same draws.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function argmax(row) {
  let best = 0;
  for (let i = 1; i < row.length; i++) if (row[i] > row[best]) best = i;
  return best;
}

// transformers' temperature, top-k and top-p warpers (ferry.generate's sampler), then a draw.
function sample(row, o, draw) {
  const n = row.length;
  const scores = new Float64Array(n);
  for (let i = 0; i < n; i++) scores[i] = row[i] / o.temperature;
  let order = Array.from({ length: n }, (_, i) => i).sort((a, b) => scores[b] - scores[a]);
  if (o.topK > 0 && o.topK < n) {
    const kth = scores[order[o.topK - 1]];
    order = order.filter((i) => scores[i] >= kth);
  }
  const top = scores[order[0]];
  let weights = order.map((i) => Math.exp(scores[i] - top));
  if (o.topP < 1) {
    const sum = weights.reduce((a, b) => a + b, 0);
    // Keep the most likely tokens until their mass exceeds top_p (the first always kept).
    let mass = 0;
    let keep = 0;
    while (keep < order.length && (keep === 0 || mass < o.topP * sum)) mass += weights[keep++];
    order = order.slice(0, keep);
    weights = weights.slice(0, keep);
  }
  const total = weights.reduce((a, b) => a + b, 0);
  let x = draw() * total;
  for (let i = 0; i < order.length; i++) {
    x -= weights[i];
    if (x < 0) return order[i];
  }
  return order[order.length - 1];
}

// Lets the page work between steps: a task (not a microtask) after every token, and a painted
// frame at least every 50 ms, so streamed text shows and a screenshot or a click gets through
// while the main thread is otherwise busy in wasm (a frame costs up to 16 ms: not every step).
let lastFrame = 0;
function yieldToPage() {
  const now = typeof performance !== 'undefined' ? performance.now() : 0;
  if (typeof requestAnimationFrame !== 'undefined' && now - lastFrame > 50) {
    lastFrame = now;
    return new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  }
  if (typeof MessageChannel === 'undefined') return Promise.resolve();
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => {
      channel.port1.close();
      resolve();
    };
    channel.port2.postMessage(null);
  });
}

export class Chat {
  constructor(session, tokenizer, template, tokenizerConfig, manifest, backend, threads) {
    this.session = session;
    this.tokenizer = tokenizer;
    this.template = template;
    this.manifest = manifest;
    this.decoder = manifest.decoder;
    this.backend = backend;
    this.threads = backend === 'wasm' ? threads : null;
    this.specials = {};
    for (const name of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
      const v = tokenizerConfig[name];
      const text = v && typeof v === 'object' ? v.content : v;
      if (typeof text === 'string') this.specials[name] = text;
    }
    this.eos = new Set(this.decoder.eos_ids);
    // The export made logits_to_keep a plain input: the prompt's head runs on its last position.
    this.keep = this.decoder.logits_to_keep;
  }

  /** The prompt text the chat template renders for `messages` (with the generation prompt). */
  render(messages) {
    return this.template.render({ ...this.specials, messages, add_generation_prompt: true });
  }

  /** The prompt's ids: the template's text tokenized as ferry's Python loop does (the
   * template writes the special tokens itself, so none are added). */
  encode(messages) {
    return this.tokenizer.encode(this.render(messages), { add_special_tokens: false }).ids;
  }

  /** Text of `ids`, special tokens skipped. */
  decode(ids) {
    if (!ids.length) return '';
    return this.tokenizer.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
  }

  // One run of the graph over `tokens` after `used` cached slots; the last position's logits.
  async step(tokens, used, past) {
    const d = this.decoder;
    const n = tokens.length;
    const feeds = {
      input_ids: new ort.Tensor('int64', BigInt64Array.from(tokens, BigInt), [1, n]),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(used + n).fill(1n), [1, used + n]),
    };
    if (d.position_ids) {
      feeds.position_ids = new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(used + i)), [1, n]);
    }
    if (this.keep) feeds.logits_to_keep = new ort.Tensor('int64', BigInt64Array.from([1n]), []);
    d.past.forEach((name, i) => { feeds[name] = past[i]; });
    const out = await this.session.run(feeds);
    const logits = out.logits;
    const vocab = logits.dims[logits.dims.length - 1];
    const row = logits.data.subarray(logits.data.length - vocab);
    return { row, present: d.present.map((name) => out[name]) };
  }

  /**
   * Generate after `promptIds`.
   *
   * @param {number[]} promptIds the prompt's ids (`encode(messages)`).
   * @param {{maxNewTokens?: number, temperature?: number, topK?: number, topP?: number,
   *          seed?: number, signal?: AbortSignal,
   *          onToken?: (t: {id: number, text: string, index: number, elapsedMs: number}) => void}} [o]
   *   temperature 0 (default): greedy, the same ids as ferry's Python loop on this graph.
   * @returns {Promise<{ids, text, finishReason, promptTokens, prefillMs, decodeMs, tokensPerSecond}>}
   */
  async generate(promptIds, o = {}) {
    const d = this.decoder;
    const opts = {
      maxNewTokens: o.maxNewTokens ?? 256,
      temperature: o.temperature ?? 0,
      topK: o.topK ?? 0,
      topP: o.topP ?? 1,
    };
    if (!Number.isInteger(opts.maxNewTokens) || opts.maxNewTokens < 1) {
      throw new Error(`ferry: maxNewTokens=${opts.maxNewTokens}: it takes an integer >= 1`);
    }
    if (!(opts.temperature >= 0) || !(opts.topP > 0 && opts.topP <= 1) || !(opts.topK >= 0)) {
      throw new Error('ferry: temperature >= 0, 0 < topP <= 1 and topK >= 0, please');
    }
    if (!promptIds.length) throw new Error('ferry: the prompt is empty');
    let budget = opts.maxNewTokens;
    if (d.context_length) {
      if (promptIds.length >= d.context_length) {
        throw new Error(`ferry: the prompt is ${promptIds.length} tokens; the context is ${d.context_length}`);
      }
      budget = Math.min(budget, d.context_length - promptIds.length);
    }
    const draw = random(o.seed ?? Date.now());
    const empty = d.kv_dtype === 'float16' ? Uint16Array : Float32Array;
    let past = d.past.map(() => new ort.Tensor(d.kv_dtype, new empty(0), [1, d.num_kv_heads, 0, d.head_dim]));
    const ids = [];
    let text = '';
    let emitted = 0;
    let finishReason = 'length';
    let tokens = promptIds;
    let used = 0;
    const t0 = performance.now();
    let tFirst = t0;
    try {
      for (let i = 0; i < budget; i++) {
        if (o.signal && o.signal.aborted) {
          finishReason = 'abort';
          break;
        }
        const { row, present } = await this.step(tokens, used, past);
        for (const t of past) if (t.location === 'gpu-buffer') t.dispose();
        past = present;
        used += tokens.length;
        const id = opts.temperature === 0 ? argmax(row) : sample(row, opts, draw);
        if (i === 0) tFirst = performance.now();
        ids.push(id);
        tokens = [id];
        let piece = '';
        if (this.eos.has(id)) {
          finishReason = 'stop';
        } else {
          text = this.decode(ids);
          let safe = text.length;
          if (i < budget - 1) while (safe > emitted && text[safe - 1] === PARTIAL) safe--;
          piece = text.slice(emitted, safe);
          emitted = safe;
        }
        if (o.onToken) o.onToken({ id, text: piece, index: i, elapsedMs: performance.now() - t0 });
        if (finishReason === 'stop') break;
        await yieldToPage();
      }
    } finally {
      for (const t of past) if (t.location === 'gpu-buffer') t.dispose();
    }
    const tEnd = performance.now();
    const decodeMs = tEnd - tFirst;
    return {
      ids,
      text,
      finishReason,
      promptTokens: promptIds.length,
      prefillMs: tFirst - t0,
      decodeMs,
      // Tokens after the first over the time they took: the decode speed a reader sees.
      tokensPerSecond: ids.length > 1 ? ((ids.length - 1) * 1000) / decodeMs : null,
    };
  }

  async release() {
    await this.session.release();
  }
}
