# Builds and runs a tiny trainer-like project that uses feedline the way users do.
#   MODE=fetchcontent: FetchContent_Declare(feedline SOURCE_DIR <this tree>) + FetchContent_MakeAvailable
#   MODE=find_package: cmake --install feedline's build tree BUILD_DIR (headers and tools) to a prefix,
#                      run each installed tool, then find_package(feedline REQUIRED) and build against it
# Usage: cmake -DSOURCE_DIR=... -DWORK_DIR=... -DMODE=... [-DBUILD_DIR=... -DTOOLS=ON|OFF] -P run_consumer.cmake
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR}/consumer)
file(COPY ${CMAKE_CURRENT_LIST_DIR}/main.cpp DESTINATION ${WORK_DIR}/consumer)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "fetchcontent")
  file(WRITE ${WORK_DIR}/consumer/CMakeLists.txt "
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
include(FetchContent)
FetchContent_Declare(feedline SOURCE_DIR \"${SOURCE_DIR}\")
FetchContent_MakeAvailable(feedline)
if(TARGET test_storage OR TARGET feedline-pack OR TARGET bench_read_throughput)
  message(FATAL_ERROR \"feedline built its tests/tools as a subproject\")
endif()
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE feedline::all)
")
elseif(MODE STREQUAL "find_package")
  # feedline's own build tree (BUILD_DIR, the one running this test, whose tools are built) is
  # installed, as a user who runs `cmake --install` gets it: the headers, the package files and the
  # tools, each of which must run from the prefix. Building the tools again in a fresh tree took five
  # minutes of one core and checked nothing more.
  if(NOT BUILD_DIR)
    message(FATAL_ERROR "find_package mode needs -DBUILD_DIR=<a configured and built feedline tree>")
  endif()
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  if(TOOLS)  # the tree was configured with FEEDLINE_BUILD_TOOLS
    foreach(tool feedline-pack feedline-inspect feedline-iterate feedline-doctor feedline-train feedline-make-corpus)
      if(NOT EXISTS ${WORK_DIR}/prefix/bin/${tool})
        message(FATAL_ERROR "cmake --install did not install ${tool}")
      endif()
      run(${WORK_DIR}/prefix/bin/${tool} --help)
    endforeach()
  endif()
  file(WRITE ${WORK_DIR}/consumer/CMakeLists.txt "
cmake_minimum_required(VERSION 3.25)
project(consumer LANGUAGES CXX)
find_package(feedline 0.1 REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE feedline::feedline feedline::uring feedline::json)
")
  set(extra -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  message(FATAL_ERROR "MODE must be fetchcontent or find_package")
endif()

run(${CMAKE_COMMAND} -S ${WORK_DIR}/consumer -B ${WORK_DIR}/consumer-build ${extra})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
run(${WORK_DIR}/consumer-build/consumer ${WORK_DIR})
message(STATUS "${last_output}")
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "consumer printed: ${last_output}")
endif()
