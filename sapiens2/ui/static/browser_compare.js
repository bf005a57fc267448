// "Compute in my browser": two photos' embeddings and their cosine similarity, computed by
// onnxruntime-web on the visitor's machine from the task's ONNX file (docs/ONNX_BROWSER.md).
// The body of a gr.HTML block's js_on_load: `element` is the block, `props.config` the server's
// settings (sapiens2/ui/browser_compare.py). The photos never leave the page.
(() => {
  const cfg = props.config || {};
  const CACHE = "sapiens2-onnx-models";
  const MAX_BYTES = cfg.max_bytes || 40 * 2 ** 20; // the server's own photo limit
  const MAX_SIDE = cfg.max_side || 4096; // the package's working copy (inputs/intake.py)
  const role = (name) => element.querySelector(`[data-role="${name}"]`);
  const state = { ort: null, backend: null, sessions: {} };

  function say(text, kind = "info") {
    const box = role("status");
    box.textContent = text;
    box.dataset.kind = kind;
  }

  function root() {
    const base = (window.gradio_config && window.gradio_config.root) || window.location.origin;
    return base.replace(/\/+$/, "");
  }

  function absolute(url) {
    return /^https?:\/\//.test(url) ? url : root() + url;
  }

  function withTimeout(promise, seconds, what) {
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what} took longer than ${seconds} s`)), seconds * 1000);
    });
    return Promise.race([promise, late]).finally(() => clearTimeout(timer));
  }

  // ------------------------------------------------------------------ onnxruntime-web

  async function webgpuUsable() {
    if (!navigator.gpu) return false;
    try {
      return Boolean(await withTimeout(navigator.gpu.requestAdapter(), 5, "Asking for a WebGPU adapter"));
    } catch (err) {
      return false;
    }
  }

  async function loadOrt() {
    if (state.ort) return state.ort;
    if (cfg.ort_error) throw new Error(cfg.ort_error);
    const gpu = await webgpuUsable();
    const base = absolute(cfg.ort_base);
    const file = gpu ? "ort.webgpu.bundle.min.mjs" : "ort.wasm.bundle.min.mjs";
    say(`Loading onnxruntime-web (${gpu ? "WebGPU" : "WebAssembly"}) from ${base} ...`);
    let ort;
    try {
      ort = await withTimeout(import(base + file), cfg.load_timeout_s || 60, "Loading onnxruntime-web");
    } catch (err) {
      throw new Error(
        `onnxruntime-web could not be loaded from ${base} (${err.message || err}). ` +
          "Nothing was computed; the server's “Compare the two photos” still works."
      );
    }
    ort.env.wasm.wasmPaths = base;
    // threads need a cross-origin isolated page (SharedArrayBuffer); a Gradio page is not
    ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
    state.ort = ort;
    state.backend = gpu ? "webgpu" : "wasm";
    return ort;
  }

  // ------------------------------------------------------------------ the model file

  async function manifest(dtype) {
    say("Asking the server for the model file (the first request on a server makes it: a minute or more) ...");
    let reply;
    try {
      reply = await fetch(absolute(cfg.manifest[dtype]), { cache: "no-store" });
    } catch (err) {
      throw new Error(`The server could not be reached (${err.message || err}).`);
    }
    const body = await reply.json().catch(() => ({}));
    if (!reply.ok || !body.url) throw new Error(body.error || `The server answered ${reply.status}.`);
    return body;
  }

  async function download(url, bytes) {
    const reply = await fetch(url);
    if (!reply.ok || !reply.body) throw new Error(`The model file could not be downloaded (${reply.status}).`);
    const reader = reply.body.getReader();
    const parts = [];
    let got = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      got += value.length;
      say(`Downloading the model: ${(got / 2 ** 20).toFixed(1)} of ${(bytes / 2 ** 20).toFixed(1)} MB ...`);
    }
    const data = new Uint8Array(got);
    let at = 0;
    for (const part of parts) {
      data.set(part, at);
      at += part.length;
    }
    return data;
  }

  // The file once per browser: Cache Storage keyed by its URL, which names the export's key
  // (weights, size, dtype, package version), so a changed model is a new entry; older entries go.
  async function modelBytes(info) {
    const url = absolute(info.url);
    const store = self.caches ? await caches.open(CACHE).catch(() => null) : null;
    const hit = store ? await store.match(url) : null;
    if (hit) return { data: new Uint8Array(await hit.arrayBuffer()), cached: true, kept: true };
    const data = await download(url, info.bytes);
    let kept = false;
    if (store) {
      for (const old of await store.keys()) {
        if (old.url.includes(info.family) && old.url !== url) await store.delete(old);
      }
      kept = await store
        .put(url, new Response(data, { headers: { "Content-Type": "application/octet-stream" } }))
        .then(() => true, () => false);
    }
    return { data, cached: false, kept };
  }

  async function forget() {
    if (self.caches) await caches.delete(CACHE);
    state.sessions = {};
    say("The model file is no longer kept in this browser.");
  }

  // ModelProto's metadata_props (field 14: StringStringEntryProto, key 1 / value 2), read from
  // the file's top-level fields: the preprocessing comes from the file itself.
  function varint(buf, pos) {
    let value = 0;
    let scale = 1;
    for (;;) {
      const b = buf[pos++];
      if (b === undefined) throw new Error("This is not an ONNX file (it ends inside a number).");
      value += (b & 0x7f) * scale;
      scale *= 128;
      if (!(b & 0x80)) return [value, pos];
    }
  }

  function fields(buf, visit) {
    let pos = 0;
    while (pos < buf.length) {
      let key, len;
      [key, pos] = varint(buf, pos);
      const wire = key % 8;
      if (wire === 0) [, pos] = varint(buf, pos);
      else if (wire === 1) pos += 8;
      else if (wire === 5) pos += 4;
      else if (wire === 2) {
        [len, pos] = varint(buf, pos);
        if (pos + len > buf.length) throw new Error("This is not an ONNX file (a field runs past its end).");
        visit(Math.floor(key / 8), buf.subarray(pos, pos + len));
        pos += len;
      } else throw new Error("This is not an ONNX file.");
    }
  }

  function metadata(buf) {
    const text = new TextDecoder();
    const props = {};
    fields(buf, (field, body) => {
      if (field !== 14) return;
      const entry = {};
      fields(body, (f, value) => (entry[f] = text.decode(value)));
      if (entry[1] !== undefined) props[entry[1]] = entry[2] || "";
    });
    return props;
  }

  function preprocessing(props, output) {
    const need = ["sapiens2.input_height", "sapiens2.input_width", "sapiens2.mean", "sapiens2.std"];
    const missing = need.filter((k) => !(k in props));
    if (missing.length) throw new Error(`The model file lacks its metadata (${missing.join(", ")}).`);
    const spec = {
      task: props["sapiens2.task"],
      height: Number(props["sapiens2.input_height"]),
      width: Number(props["sapiens2.input_width"]),
      mean: JSON.parse(props["sapiens2.mean"]),
      std: JSON.parse(props["sapiens2.std"]),
      order: props["sapiens2.channel_order"] || "RGB",
      range: props["sapiens2.value_range"] || "0-255",
      outputs: JSON.parse(props["sapiens2.outputs"] || "{}"),
    };
    const ok =
      spec.height > 0 && spec.width > 0 && spec.mean.length === 3 && spec.std.length === 3 &&
      ["RGB", "BGR"].includes(spec.order) && ["0-255", "0-1"].includes(spec.range);
    if (!ok) throw new Error("The model file's preprocessing metadata is not one this page reads.");
    if (!(output in spec.outputs)) throw new Error(`The model file has no '${output}' output.`);
    return spec;
  }

  async function session(dtype) {
    if (state.sessions[dtype]) return state.sessions[dtype];
    const ort = await loadOrt();
    const info = await manifest(dtype);
    const { data, cached, kept } = await modelBytes(info);
    const spec = preprocessing(metadata(data), cfg.output);
    say(`Starting the model (${state.backend}) ...`);
    const providers = state.backend === "webgpu" ? ["webgpu", "wasm"] : ["wasm"];
    const run = await ort.InferenceSession.create(data, { executionProviders: providers });
    const where = cached ? "kept in this browser" : kept ? "downloaded, now kept in this browser" : "downloaded (this browser cannot keep it)";
    state.sessions[dtype] = { run, spec, info, where };
    return state.sessions[dtype];
  }

  // ------------------------------------------------------------------ the photo, as the package reads it

  // Python's round(): half to even (the working copy's size, inputs/intake.py)
  function pyRound(x) {
    const r = Math.round(x);
    return Math.abs(x - Math.trunc(x)) === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }

  async function decode(file) {
    if (file.size > MAX_BYTES) throw new Error(`${file.name} is over ${MAX_BYTES / 2 ** 20} MB.`);
    let bitmap;
    try {
      bitmap = await createImageBitmap(file, {
        imageOrientation: "from-image", // upright, as the EXIF orientation says
        colorSpaceConversion: "none", // the file's values, as Pillow reads them
        premultiplyAlpha: "none",
      });
    } catch (err) {
      throw new Error(`${file.name} is not an image this browser can read.`);
    }
    const { width: w, height: h } = bitmap;
    const canvas = document.createElement("canvas");
    canvas.width = w;
    canvas.height = h;
    const ctx = canvas.getContext("2d", { willReadFrequently: true });
    ctx.fillStyle = "#ffffff"; // transparency over white, as the package composites it
    ctx.fillRect(0, 0, w, h);
    ctx.drawImage(bitmap, 0, 0);
    bitmap.close();
    const rgba = ctx.getImageData(0, 0, w, h).data;
    const rgb = new Uint8Array(w * h * 3);
    for (let i = 0, j = 0; i < rgba.length; i += 4, j += 3) {
      rgb[j] = rgba[i];
      rgb[j + 1] = rgba[i + 1];
      rgb[j + 2] = rgba[i + 2];
    }
    return { w, h, rgb };
  }

  // cv2.INTER_AREA's weights along one axis (a source cell's share of each output cell), float32
  function areaTable(dst, src) {
    const scale = 1 / (dst / src);
    const table = [];
    for (let d = 0; d < dst; d++) {
      const f1 = d * scale;
      const f2 = f1 + scale;
      const cell = Math.min(scale, src - f1);
      const s2 = Math.min(Math.floor(f2), src - 1);
      const s1 = Math.min(Math.ceil(f1), s2);
      const taps = [];
      if (s1 - f1 > 1e-3) taps.push([s1 - 1, Math.fround((s1 - f1) / cell)]);
      for (let s = s1; s < s2; s++) taps.push([s, Math.fround(1 / cell)]);
      if (f2 - s2 > 1e-3) taps.push([s2, Math.fround(Math.min(Math.min(f2 - s2, 1), cell) / cell)]);
      table.push(taps);
    }
    return table;
  }

  // cv2.INTER_AREA on uint8: a whole-number factor on both axes sums whole cells; other factors
  // weigh cells in float32, row by row, as OpenCV does
  function resizeArea(img, w, h) {
    const kx = img.w / w;
    const ky = img.h / h;
    const out = new Uint8Array(w * h * 3);
    if (Number.isInteger(kx) && Number.isInteger(ky)) {
      const inv = Math.fround(1 / (kx * ky));
      for (let y = 0; y < h; y++) {
        for (let x = 0; x < w; x++) {
          for (let c = 0; c < 3; c++) {
            let sum = 0;
            for (let j = 0; j < ky; j++) {
              for (let i = 0; i < kx; i++) sum += img.rgb[((y * ky + j) * img.w + x * kx + i) * 3 + c];
            }
            const v = kx === 2 && ky === 2 ? (sum + 2) >> 2 : pyRound(Math.fround(sum * inv));
            out[(y * w + x) * 3 + c] = v;
          }
        }
      }
      return { w, h, rgb: out };
    }
    const tx = areaTable(w, img.w);
    const ty = areaTable(h, img.h);
    const row = new Float32Array(w * 3);
    const acc = new Float32Array(w * 3);
    for (let y = 0; y < h; y++) {
      ty[y].forEach(([sy, wy], n) => {
        row.fill(0);
        for (let x = 0; x < w; x++) {
          for (const [sx, wx] of tx[x]) {
            const p = (sy * img.w + sx) * 3;
            for (let c = 0; c < 3; c++) row[x * 3 + c] += Math.fround(img.rgb[p + c] * wx);
          }
        }
        for (let i = 0; i < row.length; i++) acc[i] = n === 0 ? row[i] * wy : acc[i] + Math.fround(row[i] * wy);
      });
      for (let i = 0; i < acc.length; i++) out[y * w * 3 + i] = Math.min(255, Math.max(0, pyRound(acc[i])));
    }
    return { w, h, rgb: out };
  }

  // cv2.INTER_LINEAR on uint8: half-pixel centres, float32 offsets, 11-bit fixed-point weights;
  // an edge column takes one source pixel (clamp), an edge row keeps its weights on the edge row
  function linearTable(dst, src, clamp) {
    const scale = src / dst;
    const index = new Int32Array(dst);
    const weight = new Int32Array(dst * 2);
    for (let d = 0; d < dst; d++) {
      let f = Math.fround((d + 0.5) * scale - 0.5);
      let s = Math.floor(f);
      f = Math.fround(f - s);
      if (clamp && s < 0) (f = 0), (s = 0);
      if (clamp && s >= src - 1) (f = 0), (s = src - 1);
      index[d] = s;
      weight[2 * d] = pyRound(Math.fround(1 - f) * 2048);
      weight[2 * d + 1] = pyRound(f * 2048);
    }
    return { index, weight };
  }

  function resizeLinear(img, w, h) {
    const tx = linearTable(w, img.w, true);
    const ty = linearTable(h, img.h, false);
    const rows = new Map();
    const horizontal = (sy) => {
      if (rows.has(sy)) return rows.get(sy);
      const row = new Int32Array(w * 3);
      for (let x = 0; x < w; x++) {
        const s0 = (sy * img.w + tx.index[x]) * 3;
        const s1 = tx.index[x] + 1 < img.w ? s0 + 3 : s0;
        for (let c = 0; c < 3; c++) row[x * 3 + c] = img.rgb[s0 + c] * tx.weight[2 * x] + img.rgb[s1 + c] * tx.weight[2 * x + 1];
      }
      rows.set(sy, row);
      return row;
    };
    const out = new Uint8Array(w * h * 3);
    for (let y = 0; y < h; y++) {
      const sy = ty.index[y];
      const r0 = horizontal(Math.min(Math.max(sy, 0), img.h - 1));
      const r1 = horizontal(Math.min(Math.max(sy + 1, 0), img.h - 1));
      const b0 = ty.weight[2 * y];
      const b1 = ty.weight[2 * y + 1];
      for (let i = 0; i < w * 3; i++) {
        const v = (((b0 * (r0[i] >> 4)) >> 16) + ((b1 * (r1[i] >> 4)) >> 16) + 2) >> 2;
        out[y * w * 3 + i] = Math.min(255, Math.max(0, v));
      }
      rows.delete(sy - 1);
    }
    return { w, h, rgb: out };
  }

  // The network input of FeaturesPipeline.prepare: the working copy (long side at most MAX_SIDE,
  // INTER_AREA) stretched to the file's input size (INTER_LINEAR), as uint8 RGB
  function networkPixels(img, spec) {
    let work = img;
    const long = Math.max(img.w, img.h);
    if (long > MAX_SIDE) {
      const scale = MAX_SIDE / long;
      work = resizeArea(img, Math.max(1, pyRound(img.w * scale)), Math.max(1, pyRound(img.h * scale)));
    }
    if (work.w === spec.width && work.h === spec.height) return work.rgb;
    return resizeLinear(work, spec.width, spec.height).rgb;
  }

  function tensorOf(ort, pixels, spec) {
    const plane = spec.width * spec.height;
    const data = new Float32Array(3 * plane);
    const scale = spec.range === "0-1" ? 1 / 255 : 1;
    const channel = spec.order === "BGR" ? [2, 1, 0] : [0, 1, 2];
    for (let c = 0; c < 3; c++) {
      const src = channel[c];
      const mean = spec.mean[c];
      const std = spec.std[c];
      for (let i = 0; i < plane; i++) data[c * plane + i] = (pixels[i * 3 + src] * scale - mean) / std;
    }
    return new ort.Tensor("float32", data, [1, 3, spec.height, spec.width]);
  }

  async function embed(file, model) {
    const img = await decode(file);
    const pixels = networkPixels(img, model.spec);
    const started = performance.now();
    const out = await model.run.run({ pixel_values: tensorOf(state.ort, pixels, model.spec) });
    const seconds = (performance.now() - started) / 1000;
    const vector = Array.from(out[cfg.output].data);
    if (!vector.every(Number.isFinite)) throw new Error(`The model returned non-finite values for ${file.name}.`);
    return { vector, seconds };
  }

  // the server's cosine_similarity (tasks/features.py): float64, clipped to [-1, 1]
  function cosine(a, b) {
    if (a.length !== b.length) throw new Error("The embeddings differ in length.");
    let ab = 0;
    let aa = 0;
    let bb = 0;
    for (let i = 0; i < a.length; i++) {
      ab += a[i] * b[i];
      aa += a[i] * a[i];
      bb += b[i] * b[i];
    }
    if (aa === 0 || bb === 0) throw new Error("An embedding is all zeros; cosine similarity is undefined.");
    return Math.max(-1, Math.min(1, ab / (Math.sqrt(aa) * Math.sqrt(bb))));
  }

  // ------------------------------------------------------------------ the block

  async function compute() {
    const files = [role("photo-a").files[0], role("photo-b").files[0]].filter(Boolean);
    if (!files.length) return say("Choose one photo (its embedding) or two (their similarity).", "error");
    const dtype = role("dtype").value;
    role("run").disabled = true;
    role("score").textContent = "";
    role("download").hidden = true;
    try {
      const model = await session(dtype);
      const results = [];
      for (const [i, file] of files.entries()) {
        say(`Computing photo ${i + 1} of ${files.length} in this browser (${state.backend}) ...`);
        results.push(await embed(file, model));
      }
      const score = results.length === 2 ? cosine(results[0].vector, results[1].vector) : null;
      const secs = results.map((r) => r.seconds.toFixed(2)).join(" s, ");
      if (score !== null) role("score").textContent = `Similarity (computed in this browser): ${score.toFixed(4)}`;
      const record = {
        task: model.spec.task, size: model.info.size, dtype, backend: state.backend,
        photos: files.map((f) => f.name), similarity: score, embeddings: results.map((r) => r.vector),
      };
      const link = role("download");
      link.href = URL.createObjectURL(new Blob([JSON.stringify(record)], { type: "application/json" }));
      link.download = "embeddings_in_browser.json";
      link.hidden = false;
      element.dataset.result = JSON.stringify(record);
      say(
        `Done in this browser (${state.backend}, ${model.info.size} ${dtype}; model ${model.where}): ` +
          `${secs} s per photo. Nothing was uploaded.`,
        "done"
      );
    } catch (err) {
      say(err.message || String(err), "error");
    } finally {
      role("run").disabled = false;
    }
  }

  role("run").addEventListener("click", compute);
  role("forget").addEventListener("click", () => forget().catch((err) => say(String(err), "error")));
  if (!self.caches) say("This page is not served over https: the model file cannot be kept between visits.");
  // what the tests read back: the pre-processing and metadata reader, as the page runs them
  element.sapiens2 = { metadata, preprocessing, networkPixels, decode, cosine };
})();
