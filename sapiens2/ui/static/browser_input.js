// The model file's metadata and a photo's network input, as the package makes it, for "Compute
// in my browser" (browser_compare.js runs after this, in the same js_on_load body; both are
// read by sapiens2/ui/browser_compare.py). docs/ONNX_BROWSER.md: what is emulated and checked.
const sapiens2Input = (() => {
  // ------------------------------------------------------------------ the model file's metadata

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

  // ------------------------------------------------------------------ the photo

  // Python's round(): half to even (the working copy's size, inputs/intake.py)
  function pyRound(x) {
    const r = Math.round(x);
    return Math.abs(x - Math.trunc(x)) === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }

  async function decode(file, maxBytes) {
    if (file.size > maxBytes) throw new Error(`${file.name} is over ${maxBytes / 2 ** 20} MB.`);
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

  // The network input of FeaturesPipeline.prepare: the working copy (long side at most maxSide,
  // INTER_AREA) stretched to the file's input size (INTER_LINEAR), as uint8 RGB
  function networkPixels(img, spec, maxSide) {
    let work = img;
    const long = Math.max(img.w, img.h);
    if (long > maxSide) {
      const scale = maxSide / long;
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

  return { metadata, preprocessing, decode, networkPixels, tensorOf };
})();
