#!/usr/bin/env bash
# The native boundary under AddressSanitizer and UndefinedBehaviorSanitizer:
# the extension built sanitized (tools/build_sanitized.sh), then the fuzz
# targets (a short run of each and the saved findings) and the kernel,
# format, tokenizer and file tests run against it. Any sanitizer report
# aborts the run.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-build/sanitized}"
PY="${PYTHON:-python}"
PYTHON="$PY" tools/build_sanitized.sh "$OUT" > /dev/null
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export PYTHONPATH="$PWD/$OUT${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import goosedump._kernels as k, sys; sys.exit(0 if k.__file__.startswith('$PWD/$OUT') else
          'the sanitized build is not the one imported: ' + k.__file__)"
"$PY" -m pytest -q -p no:cacheprovider tests/test_fuzz_native.py tests/test_kernels.py tests/test_formats.py \
  tests/test_tokenizer.py tests/test_gguf.py tests/test_split.py tests/test_matmul_attention.py
