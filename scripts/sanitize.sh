#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck) over small points of the GPU ops a layer composes: the layer on the
# tiny model (every kernel of the unfused path, the MoE router, permutation, grouped GEMMs, combine) and on one
# V2-Lite layer (the fused decode kernel), each MoE op alone (the host-expert op too), the own GEMV
# (linear/own/cuda, every split) alone and inside the tiny layer's captured graph. A point runs once or twice (sampling under the
# sanitizer is slow). memcheck: any error fails. racecheck: a hazard in a kernel of ours fails, except in the fused
# decode kernels (roles:: and seesaw::decode_kernel) and cuBLAS's sm90 kernels (nvjet_*), whose shared memory is
# filled by tensor-memory-accelerator copies and ordered by mbarriers and producer/consumer named barriers
# (bar.arrive on one side, bar.sync on the other), which racecheck does not model: it reports the same kinds of pairs
# inside cuBLAS's own kernels, and in seesaw::decode_kernel it reports a write and a read of the row sums that a
# __syncthreads() separates; those are counted and listed. Usage: scripts/sanitize.sh OUT_DIR [TOOL-NAME...]
# (dslab on PATH; names such as racecheck-moe-host run only those points). The layer points cover the scratch arena
# (layer-tiny-arena; layer-tiny without it), the own weight-streaming GEMM's GPU test (stream-gemm), the fused decode at V3's 128 heads (mla-fused-v3) and 16 (mla-fused-16h; quantised caches: mla-fused-quantised; its merge that absorbs the output: mla-merge-absorb), FlashInfer's MLA decode (mla-flashinfer: its kernel is a peer's, so its
# racecheck reports are listed, not judged), the streamed experts' copies (layer-v2-lite-streamed) and the hot
# experts' split between the GPU and the CPU (layer-tiny-hot, layer-v2-lite-hot) and the sparse decodes (sparse-quest,
# sparse-infllm, sparse-dsa, sparse-dsa-cluster, sparse-dsa-stream, sparse-oracle: their selection kernels, then the fused kernel over the chosen pages or keys).
set -uo pipefail
out=${1:?usage: scripts/sanitize.sh OUT_DIR [TOOL-NAME...]}
shift
only=" $* "
mkdir -p "$out"
quick=(--min-samples 1 --min-time 0 --timeout 0.01)
status=0
run() {
  local tool=$1 name=$2; shift 2
  [ "$only" = "  " ] || [[ "$only" == *" $tool-$name "* ]] || return 0
  local log="$out/$tool-$name.log"
  # (racecheck: the projections untuned, cuBLASLt's first pick - tuned_gemm.cu says why; memcheck tunes as a run does)
  # (every report printed - the tool stops at 100 by default - so that the check below sees each kernel reported)
  local tuning=on
  [ "$tool" = racecheck ] && tuning=off
  DSLAB_GEMM_TUNING=$tuning compute-sanitizer --tool "$tool" --print-limit 100000 dslab run "$@" "${quick[@]}" --out "$out/tmp-$name" >"$log" 2>&1
  local rc=$?
  local summary ours blind
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
  ours=$(grep -E 'Race reported' -A1 "$log" | grep -oE 'dslab::[A-Za-z_:<>]*::[a-z_]+_kernel' | grep -vE '(roles|seesaw)::decode_kernel' | sort -u | tr '\n' ' ')
  blind=$(grep -cE 'Race reported.*(nvjet_sm90|(roles|seesaw)::decode_kernel)' "$log")
  if [ $rc -ne 0 ] || { [ "$tool" = memcheck ] && ! grep -q 'ERROR SUMMARY: 0 errors' "$log"; } || [ -n "$ours" ]; then
    echo "$tool $name: FAILED (exit $rc) $summary ${ours:+races in: $ours}, see $(basename "$log")"; status=1
  else
    echo "$tool $name: ok: $summary${blind:+ ($blind reports in TMA/mbarrier kernels: cuBLAS nvjet_sm90_*, the fused decode kernel)}"
  fi
  rm -rf "$out/tmp-$name"
}
# A GPU test (dslab_tests, a gtest filter) under the tool, judged as a point.
run_test() {
  local tool=$1 name=$2 filter=$3
  [ "$only" = "  " ] || [[ "$only" == *" $tool-$name "* ]] || return 0
  local log="$out/$tool-$name.log"
  compute-sanitizer --tool "$tool" dslab_tests --gtest_filter="$filter" >"$log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
  if [ $rc -ne 0 ] || ! grep -qE 'ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards' "$log"; then
    echo "$tool $name: FAILED (exit $rc) $summary, see $(basename "$log")"; status=1
  else
    echo "$tool $name: ok: $summary"
  fi
}
for tool in memcheck racecheck; do
  # (layer-tiny with each op's scratch its own allocation, so memcheck sees an overrun of it; -arena: as the layer runs)
  DSLAB_SCRATCH_ARENA=off run "$tool" layer-tiny --model tiny --variant layer/deepseek/cuda --axis layers=all --axis attn=mla/a_cc_me/cuda --axis batch=3 --axis kv_len=40 --axis page_size=16 --axis executor=eager
  run "$tool" layer-tiny-arena --model tiny --variant layer/deepseek/cuda --axis layers=all --axis attn=mla/a_cc_me/cuda --axis batch=3 --axis kv_len=40 --axis page_size=16 --axis executor=graph
  run "$tool" layer-v2-lite-streamed --model deepseek-v2-lite --variant layer/deepseek/cuda --axis layers=3 --axis batch=2 --axis kv_len=150 --axis gpu_experts=streamed --axis executor=graph
  DSLAB_SCRATCH_ARENA=off run "$tool" layer-tiny-hot --model tiny --variant layer/deepseek/cuda --axis layers=all --axis attn=mla/a_cc_me/cuda --axis batch=3 --axis kv_len=40 --axis page_size=16 --axis moe=moe/host/cuda --axis gpu_experts=hot:4 --axis cpu_threads=4 --axis executor=eager
  run "$tool" layer-v2-lite-hot --model deepseek-v2-lite --variant layer/deepseek/cuda --axis layers=2 --axis batch=4 --axis kv_len=150 --axis moe=moe/host/cuda --axis gpu_experts=hot:16 --axis cpu_threads=4 --axis executor=graph
  run "$tool" layer-v2-lite-fused --model deepseek-v2-lite --variant layer/deepseek/cuda --axis layers=1 --axis batch=2 --axis kv_len=150 --axis executor=eager
  # (V3's 128 heads on 64-key pages, the tensor-copy path: two row tiles a part, MTP's two tokens four; 96 heads: a
  # part-filled second tile, whose outputs the two-warpgroup kernel copies out of shared memory by threads)
  run "$tool" mla-fused-v3 --model deepseek-v3 --variant mla/fused/cuda --axis heads=96,128 --axis batch=3 --axis q_len=1,2 --axis kv_len=700 --axis page_size=64 --axis len_dist=mixed --axis executor=eager
  # (16 heads: the fixed-role kernel's five 32-key stages and 32-row Q, from cp.async (1-key pages) and tensor copies)
  run "$tool" mla-fused-16h --model deepseek-v3 --variant mla/fused/cuda --axis heads=16 --axis batch=3 --axis q_len=1,2 --axis kv_len=700 --axis page_size=1,64 --axis len_dist=mixed --axis executor=eager
  # (8-32 tokens a CTA, requests split and whole: the merge that absorbs the output, merge_absorb_kernel, after either kernel)
  run "$tool" mla-merge-absorb --model deepseek-v3 --variant mla/fused/cuda --axis heads=16,128 --axis batch=9 --axis q_len=1,2 --axis kv_len=700 --axis page_size=64 --axis len_dist=mixed --axis executor=eager
  # (quantised caches at 16 heads from tensor copies: the narrow kernel, 16 and 32 rows)
  run "$tool" mla-fused-quantised --model deepseek-v3 --variant mla/fused/cuda --axis heads=16 --axis batch=3 --axis q_len=1,2 --axis kv_len=700 --axis page_size=64 --axis kv_dtype=fp8_e4m3,int8 --axis len_dist=mixed --axis executor=eager
  run "$tool" mla-cd-paged --model deepseek-v2-lite --variant mla/cd_paged/cuda --axis batch=3 --axis q_len=1,5 --axis kv_len=300 --axis page_size=16 --axis len_dist=mixed
  run "$tool" mla-flashinfer --model deepseek-v3 --variant mla/flashinfer/cuda --axis heads=16,128 --axis batch=3 --axis kv_len=300 --axis page_size=16 --axis len_dist=mixed
  run "$tool" sparse-quest --model deepseek-v2-lite --variant sparse/quest/cuda --axis batch=3 --axis kv_len=900 --axis len_dist=mixed --axis budget=256 --axis local=64 --axis executor=eager
  run "$tool" sparse-infllm --model deepseek-v2-lite --variant sparse/infllm/cuda --axis batch=3 --axis kv_len=900 --axis len_dist=mixed --axis budget=256 --axis local=64 --axis executor=eager
  run "$tool" sparse-oracle --model deepseek-v2-lite --variant sparse/oracle/cuda --axis batch=3 --axis kv_len=900 --axis len_dist=mixed --axis budget=256 --axis local=64 --axis executor=eager
  run "$tool" sparse-dsa --model deepseek-v2-lite --variant sparse/dsa/cuda --axis batch=3 --axis kv_len=900 --axis len_dist=mixed --axis budget=256 --axis local=64 --axis executor=eager
  # (past 16K keys a request's top-k is the 8-CTA cluster kernel, its histograms in CTA 0's shared memory)
  run "$tool" sparse-dsa-cluster --model deepseek-v2-lite --variant sparse/dsa/cuda --axis batch=2 --axis kv_len=20000 --axis len_dist=mixed --axis budget=1024 --axis local=256 --axis executor=eager
  # (past 160K keys the cluster re-reads the scores each pass)
  run "$tool" sparse-dsa-stream --model deepseek-v2-lite --variant sparse/dsa/cuda --axis batch=1 --axis kv_len=170000 --axis budget=1024 --axis local=256 --axis executor=eager
  run "$tool" moe-grouped --model deepseek-v2-lite --variant moe/grouped/cuda --axis tokens=1,300
  # (8 experts, 64 tokens choosing 6: 48 rows an expert, the 128-row tiles the wgmma kernel takes, 32 k-stages deep;
  # all 64 experts at 512 or 2048 tokens ran past 90-150 s under racecheck)
  run "$tool" moe-grouped-wgmma --model deepseek-v2-lite --variant moe/grouped_wgmma/cuda --axis experts=8 --axis routing=uniform --axis tokens=64
  run "$tool" moe-loop --model deepseek-v2-lite --variant moe/loop/cuda --axis tokens=37
  run "$tool" moe-host --model deepseek-v2-lite --variant moe/host/cuda --axis tokens=1,40
  run "$tool" linear-own --model deepseek-v2-lite --variant linear/own/cuda --axis weight=kv_a_proj_with_mqa,o_proj,lm_head --axis tokens=1,3,8
  # (the own weight-streaming GEMM through its GPU test, every split and slab count forced: racecheck points run the
  # projections untuned, which leaves it out of every dslab run point above)
  run_test "$tool" stream-gemm 'GpuTunedGemm.OwnStreamingKernelMatchesFp64'
  run "$tool" layer-tiny-proj-own --model tiny --variant layer/deepseek/cuda --axis layers=all --axis proj=own --axis batch=2 --axis kv_len=40 --axis page_size=16 --axis executor=graph
done
exit $status
