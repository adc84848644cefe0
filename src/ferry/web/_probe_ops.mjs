// Which ONNX ops onnxruntime-web's wasm build can run: the measuring half of
// ``python -m ferry.web._gen_ops`` (see its docstring). Not shipped in bundles.
//
// usage: node _probe_ops.mjs ORT_DIST_DIR RUNTIME CASES.json START
//   ORT_DIST_DIR: onnxruntime-web's dist/ folder; RUNTIME: the runtime file stem
//   (ort-wasm-simd-threaded or ort-wasm-simd-threaded.jsep: the one the bundle ships).
// Prints one JSON line per case: {"i": index, "ok": bool, "error": message}. The caller
// restarts after a crash from the first index without a line, so one abort loses one case.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [dist, runtime, casesFile, start] = process.argv.slice(2);
const ort = await import(pathToFileURL(path.join(dist, 'ort.node.min.mjs')).href);
ort.env.wasm.numThreads = 1;
ort.env.wasm.wasmPaths = {
  mjs: pathToFileURL(path.join(dist, `${runtime}.mjs`)).href,
  wasm: pathToFileURL(path.join(dist, `${runtime}.wasm`)).href,
};
ort.env.logLevel = 'fatal';
const cases = JSON.parse(fs.readFileSync(casesFile, 'utf8'));
for (let i = Number(start); i < cases.length; i++) {
  let line;
  try {
    const session = await ort.InferenceSession.create(fs.readFileSync(cases[i].file));
    await session.release();
    line = { i, ok: true };
  } catch (e) {
    line = { i, ok: false, error: String(e && e.message ? e.message : e).slice(0, 400) };
  }
  process.stdout.write(JSON.stringify(line) + '\n');
}
