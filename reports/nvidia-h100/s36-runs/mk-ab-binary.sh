#!/bin/bash
# (how this session built its A/B binaries: dslab-NAME, and with TESTS=1 dslab_tests-NAME, from fused_seesaw.cu compiled with FLAGS and relinked from build/)
# mk.sh NAME FLAGS...: dslab-NAME and dslab_tests-NAME in build/, fused_seesaw.cu compiled with FLAGS
set -e
N=$1; shift
cd /work/main/build
/usr/local/cuda/bin/nvcc -forward-unknown-to-host-compiler -DDSLAB_SOURCE_DIR=\"/work/main\" --options-file CMakeFiles/dslab_variants.dir/includes_CUDA.rsp -lineinfo -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] -std=c++17 "$@" -x cu -c /work/main/variants/mla/cuda/fused_seesaw.cu -o /tmp/sx/seesaw_$N.o
O=CMakeFiles/dslab_variants.dir/variants/mla/cuda/fused_seesaw.cu.o
sh -c "$(sed -e "s#$O#/tmp/sx/seesaw_$N.o#" -e "s#-o dslab #-o dslab-$N #" CMakeFiles/dslab.dir/link.txt)"
if [ -n "${TESTS:-}" ]; then cd tests && sh -c "$(sed -e "s#../$O#/tmp/sx/seesaw_$N.o#" -e "s#-o dslab_tests #-o ../dslab_tests-$N #" CMakeFiles/dslab_tests.dir/link.txt)"; fi
