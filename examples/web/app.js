// The page: loads guide.onnx and digits.json (written by build.py), classifies what is drawn
// on the pad or the test digit picked, and shows the probability of each class.
//
// For tests (tests/examples/test_web_page.py), window.emberDigits.classifyBundled(n)
// classifies the first n bundled digits and resolves with their logits, probabilities and
// predictions; window.emberDigits.shown() resolves with the pixels last classified and theirs.

import * as ort from "./vendor/ort.wasm.bundle.min.mjs";
import { SIZE, argmax, drawingToPixels, normalize, softmax } from "./digits.js";

// `python -m http.server` sends no cross-origin isolation headers, so the browser offers
// no SharedArrayBuffer and the wasm backend cannot use threads: ask for one.
ort.env.wasm.numThreads = 1;

const CLASSES = 10;
const $ = (id) => document.getElementById(id);

// Why the page cannot start, with what to do about it.
class PageError extends Error {}

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) {
    throw new PageError(`${url}: HTTP ${response.status}; run python examples/web/build.py first`);
  }
  return response;
}

// digits.json, checked: it is read from disk and may be anything.
async function loadDigits() {
  const doc = await (await fetchOk("digits.json")).json();
  const { mean, std } = doc?.normalization ?? {};
  if (!Number.isFinite(mean) || !Number.isFinite(std) || std <= 0) {
    throw new PageError("digits.json: normalization needs a finite mean and a positive std");
  }
  if (doc.size !== SIZE || !Array.isArray(doc.digits)) {
    throw new PageError(`digits.json: expected size ${SIZE} and a list of digits`);
  }
  doc.digits.forEach((digit, i) => {
    const pixels = digit?.pixels;
    const okPixels = Array.isArray(pixels) && pixels.length === SIZE * SIZE &&
      pixels.every((v) => Number.isInteger(v) && v >= 0 && v <= 255);
    if (!okPixels || !Number.isInteger(digit.label) || digit.label < 0 || digit.label >= CLASSES) {
      throw new PageError(`digits.json: digit ${i} needs ${SIZE * SIZE} pixels 0-255 and a label 0-9`);
    }
  });
  return { normalization: { mean, std }, digits: doc.digits };
}

async function loadModel() {
  const bytes = new Uint8Array(await (await fetchOk("guide.onnx")).arrayBuffer());
  const session = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
  if (session.inputNames.length !== 1 || session.outputNames.length !== 1) {
    throw new PageError("guide.onnx: expected one input (images) and one output (logits)");
  }
  return session;
}

// One digit's scores, probabilities and predicted class.
async function classify(session, pixels, normalization) {
  const images = new ort.Tensor("float32", normalize(pixels, normalization), [1, SIZE, SIZE]);
  const outputs = await session.run({ [session.inputNames[0]]: images });
  const logits = Array.from(outputs[session.outputNames[0]].data);
  if (logits.length !== CLASSES) throw new PageError(`guide.onnx: expected ${CLASSES} scores`);
  const probabilities = softmax(logits);
  return { logits, probabilities, predicted: argmax(probabilities) };
}

function paintPixels(canvas, pixels) {
  const context = canvas.getContext("2d");
  const image = context.createImageData(SIZE, SIZE);
  pixels.forEach((v, i) => image.data.set([v, v, v, 255], i * 4));
  context.putImageData(image, 0, 0);
}

function makeBars() {
  const bars = $("bars");
  for (let digit = 0; digit < CLASSES; digit++) {
    const item = document.createElement("li");
    item.innerHTML = `<span class="digit">${digit}</span><span class="track"><span class="fill"></span></span>` +
      `<span class="value">–</span>`;
    bars.append(item);
  }
}

function showResult(result) {
  $("predicted").textContent = result ? String(result.predicted) : "–";
  [...$("bars").children].forEach((item, digit) => {
    const p = result ? result.probabilities[digit] : 0;
    item.classList.toggle("best", result !== null && digit === result.predicted);
    item.querySelector(".fill").style.width = `${(100 * p).toFixed(1)}%`;
    item.querySelector(".value").textContent = result ? `${(100 * p).toFixed(1)}%` : "–";
  });
}

function clearPad(pad) {
  const context = pad.getContext("2d");
  context.fillStyle = "black";
  context.fillRect(0, 0, pad.width, pad.height);
}

// Pointer events cover mouse, touch and pen alike; `touch-action: none` (style.css) keeps a
// finger's stroke from scrolling the page.
function setUpPad(pad, onDrawn) {
  const context = pad.getContext("2d", { willReadFrequently: true });
  clearPad(pad);
  let last = null;
  const at = (event) => {
    const box = pad.getBoundingClientRect();
    return [(event.clientX - box.left) * pad.width / box.width, (event.clientY - box.top) * pad.height / box.height];
  };
  pad.addEventListener("pointerdown", (event) => {
    pad.setPointerCapture(event.pointerId);
    last = at(event);
  });
  pad.addEventListener("pointermove", (event) => {
    if (last === null) return;
    const next = at(event);
    Object.assign(context, { strokeStyle: "white", lineWidth: pad.width / 14, lineCap: "round", lineJoin: "round" });
    context.beginPath();
    context.moveTo(...last);
    context.lineTo(...next);
    context.stroke();
    last = next;
    onDrawn();
  });
  const end = () => { if (last !== null) { last = null; onDrawn(); } };
  pad.addEventListener("pointerup", end);
  pad.addEventListener("pointercancel", end);
}

async function start() {
  makeBars();
  const [session, { normalization, digits }] = await Promise.all([loadModel(), loadDigits()]);
  const pad = $("pad");

  // The session runs one input at a time: a digit picked during a drawing's run waits.
  let queue = Promise.resolve();
  const runModel = (pixels) => {
    const result = queue.then(() => classify(session, pixels, normalization));
    queue = result.catch(() => {});
    return result;
  };

  let shown = null; // the pixels last classified and the result, for tests
  const show = async (pixels) => {
    paintPixels($("seen"), pixels ?? new Uint8ClampedArray(SIZE * SIZE));
    const result = pixels ? await runModel(pixels) : null;
    showResult(result);
    shown = pixels ? { pixels: Array.from(pixels), ...result } : null;
    return result;
  };

  // Classifies the drawing, one run at a time: strokes during a run are caught up after it.
  let run = null, pending = false;
  const onDrawn = () => {
    if (run) { pending = true; return run; }
    run = (async () => {
      do { pending = false; await show(drawingToPixels(pad)); } while (pending);
      run = null;
    })();
    return run;
  };
  setUpPad(pad, onDrawn);
  $("clear").addEventListener("click", () => { clearPad(pad); show(null); });

  const pick = async (digit) => {
    // The pad shows the digit enlarged; the model gets its exact pixels.
    const context = pad.getContext("2d");
    paintPixels($("seen"), digit.pixels);
    context.imageSmoothingEnabled = false;
    context.drawImage($("seen"), 0, 0, pad.width, pad.height);
    return show(digit.pixels);
  };
  digits.forEach((digit) => {
    const button = document.createElement("button");
    button.type = "button";
    button.title = `test digit ${digit.index} (label ${digit.label})`;
    const thumbnail = document.createElement("canvas");
    thumbnail.width = thumbnail.height = SIZE;
    paintPixels(thumbnail, digit.pixels);
    button.append(thumbnail);
    button.addEventListener("click", () => pick(digit));
    $("samples").append(button);
  });

  $("status").textContent = "ready: draw a digit or pick one";
  return {
    // What the page classified last, once the drawing's runs are done.
    async shown() {
      while (run) await run;
      return shown;
    },
    async classifyBundled(count) {
      const results = [];
      for (const digit of digits.slice(0, count)) {
        const { logits, probabilities, predicted } = await pick(digit);
        results.push({ index: digit.index, label: digit.label, logits, probabilities, predicted });
      }
      return results;
    },
  };
}

const started = start();
started.catch((error) => {
  $("status").textContent = `cannot start: ${error.message}`;
  $("status").classList.add("error");
});
window.emberDigits = {
  classifyBundled: async (count) => (await started).classifyBundled(count),
  shown: async () => (await started).shown(),
};
