# Detects feedline's optional dependencies and defines one INTERFACE target per optional part:
#   feedline::uring          liburing       -> io_uring reader          (else: mmap / pread)
#   feedline::cuda           CUDA Toolkit   -> pinned ring, GPU staging (else: host ring)
#   feedline::sentencepiece  sentencepiece  -> on-the-fly tokenization  (else: pre-tokenized shards only)
#   feedline::numa           libnuma        -> NUMA-local memory        (else: first-touch placement)
#   feedline::json           nlohmann_json  -> JSONL input             (else: plain text only)
#   feedline::pcre2          PCRE2          -> tokenizer.json models (byte-level BPE; with nlohmann_json) (else: refused with the reason)
#                            + simdjson     -> JSONL parsed ~20x faster (else: nlohmann_json alone)
#   feedline::remote         libcurl + pugixml -> s3:// datasets (SigV4-signed ranged reads; else: refused with the reason)
#   feedline::doctor         fmt + nlohmann_json -> feedline/doctor/ (plan, check, diagnose rules; else: absent)
#   feedline::all            every part above that was found but doctor
# Each target sets FEEDLINE_HAS_<PART>=1 only when its dependency was found, so linking a target whose
# dependency is missing is harmless: the code falls back and says why. Used in-tree and from the
# installed package config.
include_guard(GLOBAL)

find_package(PkgConfig QUIET)

# One optional part: the INTERFACE target feedline::<target> (always defined, so linking it is harmless)
# and one configure line. FOUND true: the target links LIBS, adds INCLUDES and defines
# FEEDLINE_HAS_<DEFINE>=1, and the line gives DETAIL (versions, paths); else the line gives the REASON
# and what the code does instead (FALLBACK). LABEL names it in the line (default: the target's name).
function(_feedline_part target)
  cmake_parse_arguments(P "" "LABEL;FOUND;DEFINE;DETAIL;REASON;FALLBACK" "LIBS;INCLUDES" ${ARGN})
  if(NOT P_LABEL)
    set(P_LABEL ${target})
  endif()
  if(NOT TARGET feedline::${target})
    add_library(feedline::${target} INTERFACE IMPORTED GLOBAL)
  endif()
  if(P_FOUND)
    target_link_libraries(feedline::${target} INTERFACE ${P_LIBS})
    if(P_INCLUDES)
      target_include_directories(feedline::${target} INTERFACE ${P_INCLUDES})
    endif()
    target_compile_definitions(feedline::${target} INTERFACE FEEDLINE_HAS_${P_DEFINE}=1)
    message(STATUS "feedline: ${P_LABEL}: found (${P_DETAIL})")
  else()
    message(STATUS "feedline: ${P_LABEL}: not found (${P_REASON}) -> ${P_FALLBACK}")
  endif()
endfunction()

# io_uring
if(PkgConfig_FOUND)
  pkg_check_modules(FEEDLINE_LIBURING QUIET IMPORTED_TARGET GLOBAL liburing)
endif()
_feedline_part(uring LABEL io_uring FOUND "${FEEDLINE_LIBURING_FOUND}" DEFINE URING LIBS PkgConfig::FEEDLINE_LIBURING
  DETAIL "liburing ${FEEDLINE_LIBURING_VERSION}"
  REASON "pkg-config finds no liburing; install liburing-dev" FALLBACK "reads use mmap or pread")

# CUDA
find_package(CUDAToolkit QUIET)
_feedline_part(cuda FOUND "${CUDAToolkit_FOUND}" DEFINE CUDA LIBS CUDA::cudart
  DETAIL "CUDA Toolkit ${CUDAToolkit_VERSION}; a GPU is detected at run time"
  REASON "find_package(CUDAToolkit) failed" FALLBACK "batches stay in host memory (host ring)")

# sentencepiece
find_path(FEEDLINE_SPM_INCLUDE sentencepiece_processor.h)
find_library(FEEDLINE_SPM_LIB sentencepiece)
find_library(FEEDLINE_SPM_TRAIN_LIB sentencepiece_train)
set(_found FALSE)
if(FEEDLINE_SPM_INCLUDE AND FEEDLINE_SPM_LIB AND FEEDLINE_SPM_TRAIN_LIB)
  set(_found TRUE)
endif()
_feedline_part(sentencepiece FOUND ${_found} DEFINE SENTENCEPIECE
  LIBS ${FEEDLINE_SPM_LIB} ${FEEDLINE_SPM_TRAIN_LIB} INCLUDES ${FEEDLINE_SPM_INCLUDE} DETAIL "${FEEDLINE_SPM_LIB}"
  REASON "no sentencepiece_processor.h / libsentencepiece; install libsentencepiece-dev"
  FALLBACK "text must be packed into token shards elsewhere")

# NUMA: libnuma for placement (mbind/numa_alloc_onnode). Topology is read from sysfs (exec/topology.hpp).
find_path(FEEDLINE_NUMA_INCLUDE numa.h)
find_library(FEEDLINE_NUMA_LIB numa)
set(_found FALSE)
if(FEEDLINE_NUMA_INCLUDE AND FEEDLINE_NUMA_LIB)
  set(_found TRUE)
endif()
_feedline_part(numa FOUND ${_found} DEFINE NUMA LIBS ${FEEDLINE_NUMA_LIB} INCLUDES ${FEEDLINE_NUMA_INCLUDE}
  DETAIL "libnuma ${FEEDLINE_NUMA_LIB}" REASON "no numa.h / libnuma; install libnuma-dev" FALLBACK "memory is placed by first touch")

# JSON (JSONL input). simdjson parses JSONL lines first; nlohmann_json still decides any line simdjson
# refuses (format/jsonl_field.hpp), so both builds read the same documents.
find_package(nlohmann_json 3 QUIET)
_feedline_part(json FOUND "${nlohmann_json_FOUND}" DEFINE JSON LIBS nlohmann_json::nlohmann_json
  DETAIL "nlohmann_json ${nlohmann_json_VERSION}"
  REASON "find_package(nlohmann_json) failed; install nlohmann-json3-dev" FALLBACK "JSONL input is refused with a reason")
if(nlohmann_json_FOUND)
  find_package(simdjson QUIET CONFIG)
  _feedline_part(json LABEL simdjson FOUND "${simdjson_FOUND}" DEFINE SIMDJSON LIBS simdjson::simdjson
    DETAIL "simdjson ${simdjson_VERSION}" REASON "find_package(simdjson) failed; install libsimdjson-dev"
    FALLBACK "JSONL lines are parsed by nlohmann_json alone (slower)")
endif()

# PCRE2: the pre-tokenizer patterns of tokenizer.json models (transform/tokenizer_regex.hpp).
if(PkgConfig_FOUND)
  pkg_check_modules(FEEDLINE_PCRE2 QUIET IMPORTED_TARGET GLOBAL libpcre2-8)
endif()
_feedline_part(pcre2 LABEL "PCRE2 (tokenizer.json)" FOUND "${FEEDLINE_PCRE2_FOUND}" DEFINE PCRE2 LIBS PkgConfig::FEEDLINE_PCRE2
  DETAIL "libpcre2-8 ${FEEDLINE_PCRE2_VERSION}"
  REASON "pkg-config finds no libpcre2-8; install libpcre2-dev" FALLBACK "tokenizer.json models are refused with this reason")

# Object storage (s3://): libcurl signs requests with SigV4 (7.75 or newer) and keeps connections alive;
# pugixml reads S3's XML (listings, errors).
find_package(CURL 7.75 QUIET)
find_package(pugixml QUIET CONFIG)
set(FEEDLINE_REMOTE_FOUND FALSE)
if(CURL_FOUND AND pugixml_FOUND)
  set(FEEDLINE_REMOTE_FOUND TRUE)
endif()
_feedline_part(remote LABEL "object storage (s3://)" FOUND ${FEEDLINE_REMOTE_FOUND} DEFINE REMOTE LIBS CURL::libcurl pugixml::pugixml
  DETAIL "libcurl ${CURL_VERSION_STRING}, pugixml ${pugixml_VERSION}"
  REASON "needs libcurl >= 7.75 and pugixml; install libcurl4-openssl-dev libpugixml-dev" FALLBACK "s3:// locations are refused with this reason")

# The doctor's rules (include/feedline/doctor/): fmt for their messages, nlohmann_json for their inputs
# and findings. Only what uses them links this part; it defines nothing when either is missing.
find_package(fmt QUIET)
set(FEEDLINE_DOCTOR_FOUND FALSE)
if(nlohmann_json_FOUND AND fmt_FOUND)
  set(FEEDLINE_DOCTOR_FOUND TRUE)
endif()
_feedline_part(doctor FOUND ${FEEDLINE_DOCTOR_FOUND} DEFINE DOCTOR
  LIBS feedline::feedline feedline::json fmt::fmt nlohmann_json::nlohmann_json
  DETAIL "fmt ${fmt_VERSION}, nlohmann_json ${nlohmann_json_VERSION}"
  REASON "needs fmt and nlohmann_json; install libfmt-dev nlohmann-json3-dev" FALLBACK "feedline-doctor and its rules are not available")

if(NOT TARGET feedline::all)
  add_library(feedline::all INTERFACE IMPORTED GLOBAL)
endif()
target_link_libraries(feedline::all INTERFACE feedline::feedline feedline::uring feedline::cuda
  feedline::sentencepiece feedline::numa feedline::json feedline::pcre2 feedline::remote)
