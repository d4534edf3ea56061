# Run at every build (not only at configure): the commit this binary is built from, whether the tree differs from it,
# and a hash of that difference, so a result from a dirty build says so and names which change it came from.
# Inputs: SRC (the source tree), OUT (the header to write), TEMPLATE, VERSION, BUILD_TYPE.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE DSLAB_GIT_SHA OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
execute_process(COMMAND git diff HEAD WORKING_DIRECTORY ${SRC} OUTPUT_VARIABLE diff ERROR_QUIET)
set(DSLAB_GIT_DIFF_SHA256 "")
if(NOT DSLAB_GIT_SHA)
  set(DSLAB_GIT_SHA "unknown")
elseif(NOT diff STREQUAL "")
  string(APPEND DSLAB_GIT_SHA "-dirty")
  string(SHA256 DSLAB_GIT_DIFF_SHA256 "${diff}")  # the same value as `git diff HEAD | sha256sum`
endif()
set(PROJECT_VERSION ${VERSION})
set(CMAKE_BUILD_TYPE ${BUILD_TYPE})
configure_file(${TEMPLATE} ${OUT} @ONLY)  # (rewritten only when its text changes: no rebuild otherwise)
