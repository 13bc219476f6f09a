#!/usr/bin/env bash
# Installs onnxruntime-web from the npm registry (the version package-lock.json pins, checked
# against its integrity hash by `npm ci`) and copies the files the page loads into vendor/:
# the wasm-only ES module bundle and its WebAssembly binary (no CDN, nothing fetched at page
# time). Runs once: a second run finds vendor/ made from the same lock file and does nothing.
# Usage: bash examples/web/vendor.sh
set -euo pipefail
cd "$(dirname "$0")"
# One run at a time (test workers may start it together): the lock is on this script.
exec 9<vendor.sh
flock 9
FILES=(ort.wasm.bundle.min.mjs ort-wasm-simd-threaded.wasm)
stamp="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ -f vendor/.lock-sha256 ] && [ "$(cat vendor/.lock-sha256)" = "$stamp" ]; then
    exit 0
fi
command -v npm >/dev/null || { echo "vendor.sh: npm is not installed (Node.js 18 or later)" >&2; exit 1; }
# npm installs into a scratch folder (its node_modules is ~150 MB, the page needs ~15 MB).
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cp package.json package-lock.json "$scratch/"
(cd "$scratch" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
# The new vendor/ is assembled beside the old one and renamed into place, so an interrupted
# run never leaves a half-copied folder that looks complete.
rm -rf vendor.partial
mkdir vendor.partial
for file in "${FILES[@]}"; do cp "$scratch/node_modules/onnxruntime-web/dist/$file" vendor.partial/; done
# Its package.json records the version and the license (MIT) beside the copied files.
cp "$scratch/node_modules/onnxruntime-web/package.json" vendor.partial/onnxruntime-web.package.json
echo "$stamp" > vendor.partial/.lock-sha256
rm -rf vendor
mv vendor.partial vendor
echo "vendored onnxruntime-web $(node -p 'require("./vendor/onnxruntime-web.package.json").version') into $(pwd)/vendor"
