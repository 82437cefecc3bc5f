#!/usr/bin/env bash
# The native extension built with AddressSanitizer and UndefinedBehaviorSanitizer
# into OUT (default build/sanitized), as an overlay package: OUT/goosedump is
# src/goosedump with the sanitized _kernels beside it. Run Python with it as
#   LD_PRELOAD="$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 PYTHONPATH=OUT python ...
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-build/sanitized}"
mkdir -p "$OUT"
PY="$(command -v "${PYTHON:-python}")"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"      # absolute, the venv's own (not resolved)
"$PY" -m nanobind --cmake_dir > /dev/null 2>&1 || "$PY" -m pip install -q "nanobind>=2.4" "regex>=2024.11.6"
# -O1 and line tables (-g1) as sanitizers are usually run: at the release build's -O3 with
# full -g, GCC took over 12 minutes on one AVX-512 source; the reports still name each line
cmake -S . -B "$OUT/cmake" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$PY" \
  -DGOOSEDUMP_OPT=-O1 -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" > "$OUT.log" 2>&1 || { cat "$OUT.log"; exit 1; }
cmake --build "$OUT/cmake" -j "$(nproc)" >> "$OUT.log" 2>&1 || { tail -50 "$OUT.log"; exit 1; }
rm -rf "$OUT/goosedump"
cp -r src/goosedump "$OUT/goosedump"
rm -f "$OUT"/goosedump/_kernels*.so
cp "$OUT"/cmake/_kernels*.so "$OUT/goosedump/"
echo "$OUT"
