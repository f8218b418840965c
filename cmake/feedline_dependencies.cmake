# Detects feedline's optional dependencies and defines one INTERFACE target per optional part:
#   feedline::uring          liburing       -> io_uring reader          (else: mmap / pread)
#   feedline::cuda           CUDA Toolkit   -> pinned ring, GPU staging (else: host ring)
#   feedline::sentencepiece  sentencepiece  -> on-the-fly tokenization  (else: pre-tokenized shards only)
#   feedline::numa           libnuma/hwloc  -> NUMA-local memory        (else: first-touch placement)
#   feedline::json           nlohmann_json  -> JSONL input             (else: plain text only)
#                            + simdjson     -> JSONL parsed ~20x faster (else: nlohmann_json alone)
#   feedline::doctor         fmt + nlohmann_json -> feedline/doctor/ (plan, check, diagnose rules; else: absent)
#   feedline::all            every part above that was found but doctor
# Each target sets FEEDLINE_HAS_<PART>=1 only when its dependency was found, so linking a target whose
# dependency is missing is harmless: the code falls back and says why. Used in-tree and from the
# installed package config.
include_guard(GLOBAL)

find_package(PkgConfig QUIET)

function(_feedline_part part found detail fallback)
  if(found)
    message(STATUS "feedline: ${part}: found (${detail})")
  else()
    message(STATUS "feedline: ${part}: not found (${detail}) -> ${fallback}")
  endif()
endfunction()

function(_feedline_make_part name)
  if(NOT TARGET feedline::${name})
    add_library(feedline::${name} INTERFACE IMPORTED GLOBAL)
  endif()
endfunction()

# io_uring
_feedline_make_part(uring)
if(PkgConfig_FOUND)
  pkg_check_modules(FEEDLINE_LIBURING QUIET IMPORTED_TARGET GLOBAL liburing)
endif()
if(FEEDLINE_LIBURING_FOUND)
  target_link_libraries(feedline::uring INTERFACE PkgConfig::FEEDLINE_LIBURING)
  target_compile_definitions(feedline::uring INTERFACE FEEDLINE_HAS_URING=1)
  _feedline_part(io_uring TRUE "liburing ${FEEDLINE_LIBURING_VERSION}" "")
else()
  _feedline_part(io_uring FALSE "pkg-config finds no liburing; install liburing-dev" "reads use mmap or pread")
endif()

# CUDA
_feedline_make_part(cuda)
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  target_link_libraries(feedline::cuda INTERFACE CUDA::cudart)
  target_compile_definitions(feedline::cuda INTERFACE FEEDLINE_HAS_CUDA=1)
  _feedline_part(cuda TRUE "CUDA Toolkit ${CUDAToolkit_VERSION}; a GPU is detected at run time" "")
else()
  _feedline_part(cuda FALSE "find_package(CUDAToolkit) failed" "batches stay in host memory (host ring)")
endif()

# sentencepiece
_feedline_make_part(sentencepiece)
find_path(FEEDLINE_SPM_INCLUDE sentencepiece_processor.h)
find_library(FEEDLINE_SPM_LIB sentencepiece)
find_library(FEEDLINE_SPM_TRAIN_LIB sentencepiece_train)
if(FEEDLINE_SPM_INCLUDE AND FEEDLINE_SPM_LIB AND FEEDLINE_SPM_TRAIN_LIB)
  target_include_directories(feedline::sentencepiece INTERFACE ${FEEDLINE_SPM_INCLUDE})
  target_link_libraries(feedline::sentencepiece INTERFACE ${FEEDLINE_SPM_LIB} ${FEEDLINE_SPM_TRAIN_LIB})
  target_compile_definitions(feedline::sentencepiece INTERFACE FEEDLINE_HAS_SENTENCEPIECE=1)
  _feedline_part(sentencepiece TRUE "${FEEDLINE_SPM_LIB}" "")
else()
  _feedline_part(sentencepiece FALSE "no sentencepiece_processor.h / libsentencepiece; install libsentencepiece-dev"
    "text must be packed into token shards elsewhere")
endif()

# NUMA: libnuma for placement (mbind/numa_alloc_onnode), hwloc for topology when present.
_feedline_make_part(numa)
find_path(FEEDLINE_NUMA_INCLUDE numa.h)
find_library(FEEDLINE_NUMA_LIB numa)
if(PkgConfig_FOUND)
  pkg_check_modules(FEEDLINE_HWLOC QUIET IMPORTED_TARGET GLOBAL hwloc)
endif()
if(FEEDLINE_NUMA_INCLUDE AND FEEDLINE_NUMA_LIB)
  target_include_directories(feedline::numa INTERFACE ${FEEDLINE_NUMA_INCLUDE})
  target_link_libraries(feedline::numa INTERFACE ${FEEDLINE_NUMA_LIB})
  target_compile_definitions(feedline::numa INTERFACE FEEDLINE_HAS_NUMA=1)
  set(_numa_detail "libnuma ${FEEDLINE_NUMA_LIB}")
  if(FEEDLINE_HWLOC_FOUND)
    target_link_libraries(feedline::numa INTERFACE PkgConfig::FEEDLINE_HWLOC)
    target_compile_definitions(feedline::numa INTERFACE FEEDLINE_HAS_HWLOC=1)
    string(APPEND _numa_detail ", hwloc ${FEEDLINE_HWLOC_VERSION}")
  endif()
  _feedline_part(numa TRUE "${_numa_detail}" "")
else()
  _feedline_part(numa FALSE "no numa.h / libnuma; install libnuma-dev" "memory is placed by first touch")
endif()

# JSON (JSONL input)
_feedline_make_part(json)
find_package(nlohmann_json 3 QUIET)
if(nlohmann_json_FOUND)
  target_link_libraries(feedline::json INTERFACE nlohmann_json::nlohmann_json)
  target_compile_definitions(feedline::json INTERFACE FEEDLINE_HAS_JSON=1)
  _feedline_part(json TRUE "nlohmann_json ${nlohmann_json_VERSION}" "")
  # simdjson parses JSONL lines first; nlohmann_json still decides any line simdjson refuses
  # (format/jsonl_field.hpp), so both builds read the same documents.
  find_package(simdjson QUIET CONFIG)
  if(simdjson_FOUND)
    target_link_libraries(feedline::json INTERFACE simdjson::simdjson)
    target_compile_definitions(feedline::json INTERFACE FEEDLINE_HAS_SIMDJSON=1)
    _feedline_part(simdjson TRUE "simdjson ${simdjson_VERSION}" "")
  else()
    _feedline_part(simdjson FALSE "find_package(simdjson) failed; install libsimdjson-dev" "JSONL lines are parsed by nlohmann_json alone (slower)")
  endif()
else()
  _feedline_part(json FALSE "find_package(nlohmann_json) failed; install nlohmann-json3-dev" "JSONL input is refused with a reason")
endif()

# The doctor's rules (include/feedline/doctor/): fmt for their messages, nlohmann_json for their inputs
# and findings. Only what uses them links this part; it defines nothing when either is missing.
_feedline_make_part(doctor)
find_package(fmt QUIET)
if(nlohmann_json_FOUND AND fmt_FOUND)
  target_link_libraries(feedline::doctor INTERFACE feedline::feedline feedline::json fmt::fmt nlohmann_json::nlohmann_json)
  target_compile_definitions(feedline::doctor INTERFACE FEEDLINE_HAS_DOCTOR=1)
  set(FEEDLINE_DOCTOR_FOUND TRUE)
  _feedline_part(doctor TRUE "fmt ${fmt_VERSION}, nlohmann_json ${nlohmann_json_VERSION}" "")
else()
  _feedline_part(doctor FALSE "needs fmt and nlohmann_json; install libfmt-dev nlohmann-json3-dev" "feedline-doctor and its rules are not available")
endif()

_feedline_make_part(all)
target_link_libraries(feedline::all INTERFACE feedline::feedline feedline::uring feedline::cuda
  feedline::sentencepiece feedline::numa feedline::json)
