// The page's arithmetic, kept free of the DOM's state: the guide's normalization, a drawing
// brought to MNIST's 28x28 layout, and the softmax of the model's scores.

export const SIZE = 28;

// MNIST's digits fill a 20x20 box, centred by their centre of mass in the 28x28 image;
// a drawing is brought to the same layout so the model sees what it was trained on.
const BOX = 20;

// Each pixel x (0 to 255) becomes (x / 255 - mean) / std, as the guide's MnistBatcher
// (src/ember/guide/data.py) computes it in float32: Math.fround after each step rounds
// as float32 arithmetic does, so a bundled digit reaches the model bit for bit as in ember.
export function normalize(pixels, { mean, std }) {
  const out = new Float32Array(pixels.length);
  const m = Math.fround(mean);
  const s = Math.fround(std);
  for (let i = 0; i < pixels.length; i++) {
    out[i] = Math.fround(Math.fround(Math.fround(pixels[i] / 255) - m) / s);
  }
  return out;
}

// Probabilities from scores, shifted by the largest score first so no exp overflows.
export function softmax(logits) {
  const top = Math.max(...logits);
  const exps = Array.from(logits, (v) => Math.exp(v - top));
  const total = exps.reduce((a, b) => a + b, 0);
  return exps.map((v) => v / total);
}

export function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

// The drawing on `canvas` (white ink on black) as 28x28 pixels, 0 to 255 as MNIST stores
// them; null when nothing is drawn.
export function drawingToPixels(canvas) {
  const { width, height } = canvas;
  const ink = canvas.getContext("2d").getImageData(0, 0, width, height).data;
  let top = height, bottom = -1, left = width, right = -1;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (ink[(y * width + x) * 4] > 0) {
        top = Math.min(top, y); bottom = Math.max(bottom, y);
        left = Math.min(left, x); right = Math.max(right, x);
      }
    }
  }
  if (bottom < 0) return null;

  // The ink's bounding box, scaled (the browser averages) to fit BOX x BOX.
  const boxWidth = right - left + 1, boxHeight = bottom - top + 1;
  const scale = BOX / Math.max(boxWidth, boxHeight);
  const w = Math.max(1, Math.round(boxWidth * scale)), h = Math.max(1, Math.round(boxHeight * scale));
  const small = document.createElement("canvas");
  small.width = w; small.height = h;
  const smallContext = small.getContext("2d", { willReadFrequently: true });
  smallContext.imageSmoothingQuality = "high";
  smallContext.drawImage(canvas, left, top, boxWidth, boxHeight, 0, 0, w, h);
  const box = smallContext.getImageData(0, 0, w, h).data;

  // Placed in the 28x28 image so that its centre of mass falls on the centre.
  let mass = 0, sumX = 0, sumY = 0;
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const v = box[(y * w + x) * 4];
      mass += v; sumX += v * x; sumY += v * y;
    }
  }
  const offsetX = Math.round(SIZE / 2 - (mass ? sumX / mass : w / 2) - 0.5);
  const offsetY = Math.round(SIZE / 2 - (mass ? sumY / mass : h / 2) - 0.5);
  const pixels = new Uint8ClampedArray(SIZE * SIZE);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const tx = x + offsetX, ty = y + offsetY;
      if (tx >= 0 && tx < SIZE && ty >= 0 && ty < SIZE) pixels[ty * SIZE + tx] = box[(y * w + x) * 4];
    }
  }
  return pixels;
}
