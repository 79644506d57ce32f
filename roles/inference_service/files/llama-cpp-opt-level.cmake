# Included by build-llama-cpp.sh through CMAKE_PROJECT_INCLUDE (after each project() call; the guard keeps the first).
# The inference path (ggml/: kernels and CPU variants; src/: libllama, tokenizer, sampling) keeps the build type's
# -O3. The programs' own code (common/, tools/, vendor/: argument parsing, chat templates, JSON, HTTP) is compiled at
# -O1: it runs per request, not per weight, and is two thirds of the compile (1874 of 2683 job-s); -O1 halves it.
include_guard(GLOBAL)

function(llmtune_opt_level dir)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    llmtune_opt_level("${sub}")
  endforeach()
  file(RELATIVE_PATH rel "${CMAKE_SOURCE_DIR}" "${dir}")
  if(NOT rel MATCHES "^(common|tools|vendor)(/|$)")
    return()
  endif()
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type "${target}" TYPE)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      # After CMAKE_<LANG>_FLAGS_RELEASE on the command line: the compiler keeps the last -O.
      target_compile_options("${target}" PRIVATE -O1)
    endif()
  endforeach()
endfunction()

# At the end of the top-level CMakeLists.txt, when every target exists.
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL llmtune_opt_level "${CMAKE_SOURCE_DIR}")
