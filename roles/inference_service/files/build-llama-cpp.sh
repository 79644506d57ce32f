#!/bin/sh
# build-llama-cpp.sh SOURCE BUILD [CMAKE_ARG...]: compile llama.cpp's server and tools from SOURCE in the folder
# BUILD, and write them, their shared libraries and every CPU backend ggml built (libggml-cpu-*.so) as a tar to
# "$ONCE_PART" (see once.sh), with build-info.txt (cmake arguments, compile seconds).
# RPATH $ORIGIN: the programs find their libraries in their own folder wherever the tar is unpacked; ggml loads its
# backends from the program's folder too (ggml/src/ggml-backend-reg.cpp), scoring each CPU variant on the host's CPU.
# LLAMA_USE_PREBUILT_UI=OFF: no download of the web UI (no hub access); LLAMA_OPENSSL=OFF: the server speaks HTTP on
# loopback only, nginx terminates anything else.
set -eu
src=$1
build=$2
shift 2
start=$(date +%s)
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  '-DCMAKE_INSTALL_RPATH=$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "$@" >"$build.cmake.log" 2>&1 || { tail -n 30 "$build.cmake.log" >&2; exit 1; }
# ggml depends on every CPU backend module (a MODULE library the programs do not link).
cmake --build "$build" --target llama-server llama-bench llama-quantize ggml >"$build.build.log" 2>&1 ||
  { tail -n 30 "$build.build.log" >&2; exit 1; }
cd "$build/bin"
printf 'cmake arguments: %s\ncompile seconds: %s\n' "$*" $(($(date +%s) - start)) >build-info.txt
# build-info.txt last: hosts take its presence for a whole unpack.
tar -cf "$ONCE_PART" llama-server llama-bench llama-quantize lib*.so* build-info.txt
