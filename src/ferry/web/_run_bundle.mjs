// Run a web bundle's model in Node through the bundle's own ferry.js and ort/ files: the check
// ``ferry.web.run_bundle_in_node`` makes before an export is published. Not shipped in bundles.
//
// usage: node _run_bundle.mjs BUNDLE_DIR IO_DIR
//   IO_DIR/feeds.json: [{name, dtype, shape, file}] with each input's raw little-endian bytes in
//   IO_DIR/<file>. Writes IO_DIR/outputs.json ([{name, dtype, shape, file}]) and the raw output
//   bytes beside it. Errors go to stderr as one line, exit 1.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [bundle, io] = process.argv.slice(2);
try {
  const ferry = await import(pathToFileURL(path.join(bundle, 'ferry.js')).href);
  const manifest = JSON.parse(fs.readFileSync(path.join(bundle, 'manifest.json'), 'utf8'));
  const bytes = fs.readFileSync(path.join(bundle, manifest.model.file));
  const session = await ferry.load(new Uint8Array(bytes), { backend: 'wasm', threads: 1 });
  const feedsSpec = JSON.parse(fs.readFileSync(path.join(io, 'feeds.json'), 'utf8'));
  const TYPED = { float32: Float32Array, float64: Float64Array, int8: Int8Array, uint8: Uint8Array,
    int16: Int16Array, uint16: Uint16Array, int32: Int32Array, uint32: Uint32Array,
    int64: BigInt64Array, uint64: BigUint64Array, bool: Uint8Array, float16: Uint16Array };
  const feeds = {};
  for (const f of feedsSpec) {
    const raw = fs.readFileSync(path.join(io, f.file));
    const Typed = TYPED[f.dtype];
    const copy = new Uint8Array(raw.length);
    copy.set(raw);
    feeds[f.name] = { data: new Typed(copy.buffer), shape: f.shape };
  }
  const outputs = await session.run(feeds);
  const listing = [];
  let i = 0;
  for (const [name, t] of Object.entries(outputs)) {
    const file = `out${i++}.bin`;
    fs.writeFileSync(path.join(io, file), Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    listing.push({ name, dtype: t.dtype, shape: t.shape, file });
  }
  fs.writeFileSync(path.join(io, 'outputs.json'), JSON.stringify(listing));
  await session.release();
  process.exit(0);
} catch (e) {
  process.stderr.write(String(e && e.message ? e.message : e).replace(/\s+/g, ' ') + '\n');
  process.exit(1);
}
