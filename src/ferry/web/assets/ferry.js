// ferry.js: run the bundle's ONNX model with onnxruntime-web, in a browser or in Node.
//
//   import { load } from './ferry.js';
//   const session = await load('model.onnx', { backend: 'auto', threads: 4 });
//   session.inputs   // [{name, dtype, shape}]
//   const out = await session.run({ x: { data: Float32Array.from(...), shape: [1, 3, 224, 224] } });
//   out.y            // {data: TypedArray, shape: [...], dtype: 'float32'}
//
// Written by `ferry export --target web`; the runtime files it loads sit in ./ort/ beside it.
import * as ort from './ort/__ORT_ENTRY__';

export const ORT_WEB_VERSION = '__ORT_VERSION__';

const TYPED = {
  float32: Float32Array,
  float64: Float64Array,
  int8: Int8Array,
  uint8: Uint8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  uint32: Uint32Array,
  int64: BigInt64Array,
  uint64: BigUint64Array,
  bool: Uint8Array,
  // float16 travels as its raw 16-bit patterns: not every browser has Float16Array.
  float16: Uint16Array,
};

let configured = null;

// The runtime is configured once per page: onnxruntime-web reads env when its first session
// is created and ignores later changes.
function configure(threads) {
  if (configured !== null) return configured;
  // The .mjs/.wasm runtime is next to this file, wherever the bundle is hosted.
  ort.env.wasm.wasmPaths = new URL('./ort/', import.meta.url).href;
  // Threads need SharedArrayBuffer, which browsers give only to cross-origin isolated pages
  // (COOP/COEP headers, as `ferry serve` sends); elsewhere one thread is all that works.
  const isolated = globalThis.crossOriginIsolated === true;
  const cores = (globalThis.navigator && navigator.hardwareConcurrency) || 1;
  let n = threads == null ? (isolated ? cores : 1) : Math.max(1, Math.floor(Number(threads)));
  if (!isolated && n > 1 && typeof window !== 'undefined') n = 1;
  ort.env.wasm.numThreads = n;
  // SIMD needs no switch: the runtime file is the SIMD build (onnxruntime-web >= 1.19 ships
  // only SIMD builds).
  configured = n;
  return n;
}

async function fetchModel(source) {
  if (source instanceof Uint8Array) return source;
  if (source instanceof ArrayBuffer) return new Uint8Array(source);
  const url = String(source);
  let response;
  try {
    response = await fetch(url);
  } catch (e) {
    throw new Error(`ferry: cannot fetch the model ${url}: ${e && e.message ? e.message : e}`);
  }
  if (!response.ok) {
    throw new Error(
      response.status === 404
        ? `ferry: model not found: ${url} (HTTP 404); is the bundle's model file beside index.html?`
        : `ferry: cannot fetch the model ${url}: HTTP ${response.status} ${response.statusText}`,
    );
  }
  return new Uint8Array(await response.arrayBuffer());
}

async function webgpuAvailable() {
  const gpu = globalThis.navigator && navigator.gpu;
  if (!gpu) return false;
  try {
    return (await gpu.requestAdapter()) != null;
  } catch {
    return false;
  }
}

function spec(name, meta) {
  const m = meta || {};
  return {
    name,
    dtype: m.type || 'unknown',
    shape: Array.isArray(m.shape) ? m.shape.map((d) => (typeof d === 'number' ? d : String(d))) : null,
  };
}

function toTensor(input, feed) {
  if (feed == null || feed.data == null || !Array.isArray(feed.shape)) {
    throw new Error(`ferry: input ${input.name} must be {data: TypedArray|Array, shape: [...]}`);
  }
  const dtype = input.dtype;
  const Typed = TYPED[dtype];
  if (!Typed) throw new Error(`ferry: input ${input.name} has type ${dtype}, which ferry.js cannot feed`);
  const size = feed.shape.reduce((a, b) => a * b, 1);
  if (feed.data.length !== size) {
    throw new Error(
      `ferry: input ${input.name}: ${feed.data.length} values for shape [${feed.shape}] (${size} expected)`,
    );
  }
  let data = feed.data;
  if (!(data instanceof Typed)) {
    const big = dtype === 'int64' || dtype === 'uint64';
    data = Typed.from(data, big ? (v) => BigInt(Math.round(Number(v))) : (v) => Number(v));
  }
  return new ort.Tensor(dtype, data, feed.shape);
}

function fromTensor(tensor) {
  return { data: tensor.data, shape: Array.from(tensor.dims), dtype: tensor.type };
}

/**
 * Load a model and return a session.
 *
 * @param {string|URL|Uint8Array|ArrayBuffer} source the model's URL (relative to the page) or bytes.
 * @param {{backend?: 'auto'|'wasm'|'webgpu', threads?: number}} [options]
 *   backend: 'auto' (default) takes WebGPU when the browser offers it and falls back to wasm;
 *   threads: wasm threads (default: every core when the page is cross-origin isolated, else 1).
 * @returns {Promise<{inputs, outputs, backend, threads, run, release}>}
 */
export async function load(source, options = {}) {
  const known = ['backend', 'threads'];
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) throw new Error(`ferry: unknown option ${key}; known: ${known.join(', ')}`);
  }
  const wanted = options.backend || 'auto';
  if (!['auto', 'wasm', 'webgpu'].includes(wanted)) {
    throw new Error(`ferry: unknown backend ${wanted}; use 'auto', 'wasm' or 'webgpu'`);
  }
  const threads = configure(options.threads);
  const bytes = await fetchModel(source);
  let backend = wanted;
  if (wanted === 'auto') backend = (await webgpuAvailable()) ? 'webgpu' : 'wasm';
  if (wanted === 'webgpu' && !(await webgpuAvailable())) {
    throw new Error('ferry: backend webgpu failed: this browser offers no WebGPU adapter; use backend wasm');
  }
  let session;
  try {
    session = await ort.InferenceSession.create(bytes, { executionProviders: [backend] });
  } catch (e) {
    const message = e && e.message ? e.message : String(e);
    if (wanted === 'auto' && backend === 'webgpu') {
      // WebGPU lacks some kernels and some adapters misbehave: the CPU build runs everything.
      backend = 'wasm';
      try {
        session = await ort.InferenceSession.create(bytes, { executionProviders: ['wasm'] });
      } catch (e2) {
        throw new Error(`ferry: backend wasm failed to load the model: ${e2 && e2.message ? e2.message : e2}`);
      }
    } else {
      throw new Error(`ferry: backend ${backend} failed to load the model: ${message}`);
    }
  }
  const inputMeta = session.inputMetadata || [];
  const outputMeta = session.outputMetadata || [];
  const inputs = session.inputNames.map((n, i) => spec(n, inputMeta[i]));
  const outputs = session.outputNames.map((n, i) => spec(n, outputMeta[i]));
  return {
    inputs,
    outputs,
    backend,
    threads: backend === 'wasm' ? threads : null,
    /** Run on `{name: {data, shape}}`; returns `{name: {data, shape, dtype}}`. */
    async run(feeds) {
      const names = inputs.map((i) => i.name);
      for (const name of Object.keys(feeds || {})) {
        if (!names.includes(name)) throw new Error(`ferry: unknown input ${name}; the model's inputs: ${names.join(', ')}`);
      }
      const tensors = {};
      for (const input of inputs) {
        if (!(input.name in (feeds || {}))) throw new Error(`ferry: input ${input.name} is missing`);
        tensors[input.name] = toTensor(input, feeds[input.name]);
      }
      let results;
      try {
        results = await session.run(tensors);
      } catch (e) {
        throw new Error(`ferry: the model failed to run: ${e && e.message ? e.message : e}`);
      }
      const out = {};
      for (const name of session.outputNames) out[name] = fromTensor(results[name]);
      return out;
    },
    async release() {
      await session.release();
    },
  };
}
