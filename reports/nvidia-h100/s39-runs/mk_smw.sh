#!/bin/bash
# dslab-smw: the fused kernels recompiled against the experimental Params (parts_by_sm), roles and fused.cu from /tmp/sx
set -e
cd /work/main/build
NV="/usr/local/cuda/bin/nvcc -forward-unknown-to-host-compiler -DDSLAB_SOURCE_DIR=\"/work/main\" -I/tmp/sx --options-file CMakeFiles/dslab_variants.dir/includes_CUDA.rsp -lineinfo -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] -std=c++17 -DDSLAB_SM_WEIGHTS=1 -DDSLAB_SM_RATES=1 -x cu -c"
mkdir -p /tmp/sx/smw
$NV /tmp/sx/roles_smw.cu -o /tmp/sx/smw/fused_roles.o &
$NV /tmp/sx/fused_smw.cu -o /tmp/sx/smw/fused.o
wait
$NV /work/main/variants/mla/cuda/fused_seesaw.cu -o /tmp/sx/smw/fused_seesaw.o &
$NV /work/main/variants/mla/cuda/fused_fp8.cu -o /tmp/sx/smw/fused_fp8.o
wait
$NV /work/main/variants/mla/cuda/fused_narrow.cu -o /tmp/sx/smw/fused_narrow.o
D=CMakeFiles/dslab_variants.dir/variants/mla/cuda
sh -c "$(sed -e "s#$D/fused_roles.cu.o#/tmp/sx/smw/fused_roles.o#" -e "s#$D/fused.cu.o #/tmp/sx/smw/fused.o #" -e "s#$D/fused_seesaw.cu.o#/tmp/sx/smw/fused_seesaw.o#" -e "s#$D/fused_fp8.cu.o#/tmp/sx/smw/fused_fp8.o#" -e "s#$D/fused_narrow.cu.o#/tmp/sx/smw/fused_narrow.o#" -e "s#-o dslab #-o dslab-smw #" CMakeFiles/dslab.dir/link.txt)"
ls -la dslab-smw
