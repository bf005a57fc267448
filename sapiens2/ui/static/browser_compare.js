// "Compute in my browser": two photos' embeddings and their cosine similarity, computed by
// onnxruntime-web on the visitor's machine from the task's ONNX file (docs/ONNX_BROWSER.md).
// The body of a gr.HTML block's js_on_load: `element` is the block, `props.config` the server's
// settings (sapiens2/ui/browser_compare.py). The photos never leave the page.
(() => {
  const cfg = props.config || {};
  const CACHE = "sapiens2-onnx-models";
  const MAX_BYTES = cfg.max_bytes || 40 * 2 ** 20; // the server's own photo limit
  const MAX_SIDE = cfg.max_side || 4096; // the package's working copy (inputs/intake.py)
  const { metadata, preprocessing, tensorOf } = sapiens2Input;
  const decode = (file) => sapiens2Input.decode(file, MAX_BYTES);
  const networkPixels = (img, spec) => sapiens2Input.networkPixels(img, spec, MAX_SIDE);
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


  async function session(dtype) {
    if (state.sessions[dtype]) return state.sessions[dtype];
    const ort = await loadOrt();
    const info = await manifest(dtype);
    const { data, cached, kept } = await modelBytes(info);
    const spec = preprocessing(metadata(data), cfg.output);
    say(`Starting the model (${state.backend}) ...`);
    let run;
    try {
      const providers = state.backend === "webgpu" ? ["webgpu", "wasm"] : ["wasm"];
      run = await ort.InferenceSession.create(data, { executionProviders: providers });
    } catch (err) {
      if (state.backend !== "webgpu") throw new Error(`The model could not be started (${err.message || err}).`);
      state.backend = "wasm"; // this browser's WebGPU cannot run it: WebAssembly can
      say("WebGPU could not run the model; starting it with WebAssembly ...");
      run = await ort.InferenceSession.create(data, { executionProviders: ["wasm"] });
    }
    const where = cached ? "kept in this browser" : kept ? "downloaded, now kept in this browser" : "downloaded (this browser cannot keep it)";
    state.sessions[dtype] = { run, spec, info, where };
    return state.sessions[dtype];
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

  // the server's cosine_similarity (tasks/features/features_pipeline.py): float64, clipped to [-1, 1]
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
      if (link.href.startsWith("blob:")) URL.revokeObjectURL(link.href); // the previous run's
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
