#!/bin/sh
# build-llama-cpp.sh SOURCE BUILD VARIANTS [--patch FILE]... [CMAKE_ARG...]: compile llama.cpp's server and tools
# (llama-perplexity: the quality gate of quantized types) from SOURCE in the folder BUILD, and write them, their
# shared libraries and every CPU backend ggml built (libggml-cpu-*.so) as a tar to "$ONCE_PART" (see once.sh), with
# build-info.txt (cmake arguments, CPU variants, patches, compile seconds).
# VARIANTS: "all", or the space-separated CPU variants of -DGGML_CPU_ALL_VARIANTS=ON to keep (e.g. "haswell zen4");
# each variant costs about 100 CPU-seconds. ggml has no option for a subset, so the build reads a hard-linked copy of
# SOURCE whose ggml/src/CMakeLists.txt lists only those; an unknown name fails with the release's list.
# --patch FILE: a unified diff (patch -p1) applied to such a copy of SOURCE; patch(1) writes a patched file anew, so
# SOURCE itself stays as released. A patch that does not apply fails the build, naming it.
# RPATH $ORIGIN: the programs find their libraries in their own folder wherever the tar is unpacked; ggml loads its
# backends from the program's folder too (ggml/src/ggml-backend-reg.cpp), scoring each CPU variant on the host's CPU.
# LLAMA_USE_PREBUILT_UI=OFF: no download of the web UI (no hub access); LLAMA_OPENSSL=OFF: the server speaks HTTP on
# loopback only, nginx terminates anything else.
# llama-cpp-opt-level.cmake: the programs' own code at -O1, the inference path at the build type's -O3.
set -eu
src=$1
build=$2
variants=$3
shift 3
start=$(date +%s)
copied=
copy_source() {
  [ -z "$copied" ] || return 0
  rm -rf "$build.src"
  cp -al "$src" "$build.src"
  copied=1
}
patches=
while [ "${1-}" = --patch ]; do
  copy_source
  patch -p1 --batch --forward --no-backup-if-mismatch --quiet -d "$build.src" -i "$2" >&2 ||
    { echo "llama.cpp patch $2 does not apply to $src" >&2; exit 2; }
  patches="$patches $(basename "$2")"
  shift 2
done
if [ "$variants" != all ]; then
  copy_source
  # The copy's list, which a patch may have changed.
  list=$build.src/ggml/src/CMakeLists.txt
  known=$(sed -n 's/^ *ggml_add_cpu_backend_variant(\([^ )]*\).*/\1/p' "$list" | tr '\n' ' ')
  for variant in $variants; do
    case " $known " in *" $variant "*) ;; *) echo "no CPU variant $variant in this llama.cpp; it has: $known" >&2; exit 2 ;; esac
  done
  # A new file in its place, not an edit: the copy's other files are the source's own (hard links).
  awk -v keep=" $variants " '
    match($0, /^ *ggml_add_cpu_backend_variant\([^ )]*/) {
      tag = substr($0, RSTART, RLENGTH); sub(/.*\(/, "", tag)
      if (index(keep, " " tag " ") == 0) next
    }
    { print }' "$list" >"$list.new"
  mv "$list.new" "$list"
fi
[ -z "$copied" ] || src=$build.src
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  '-DCMAKE_INSTALL_RPATH=$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
  "-DCMAKE_PROJECT_INCLUDE=$(cd "$(dirname "$0")" && pwd)/llama-cpp-opt-level.cmake" "$@" >"$build.cmake.log" 2>&1 || { tail -n 30 "$build.cmake.log" >&2; exit 1; }
# ggml depends on every CPU backend module (a MODULE library the programs do not link).
cmake --build "$build" --target llama-server llama-bench llama-batched-bench llama-quantize llama-perplexity ggml \
  >"$build.build.log" 2>&1 ||
  { tail -n 30 "$build.build.log" >&2; exit 1; }
cd "$build/bin"
printf 'cmake arguments: %s\nCPU variants: %s\npatches:%s\ncompile seconds: %s\n' "$*" "$variants" "$patches" \
  $(($(date +%s) - start)) >build-info.txt
# build-info.txt last: hosts take its presence for a whole unpack.
tar -cf "$ONCE_PART" llama-server llama-bench llama-batched-bench llama-quantize llama-perplexity lib*.so* build-info.txt
