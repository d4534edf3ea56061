import sys
level=int(sys.argv[1])
p='/work/main/variants/mla/cuda/fused.cu'
src=open(p).read()
def rep(old,new,cnt=1):
    global src
    assert src.count(old)==cnt,(old,src.count(old)); src=src.replace(old,new)
if level>=1:  # I1: reuse P's fragments where the warp's scale1 is 1
    rep("""  const float scale1_lo = meta->scale1[l.r_lo], scale1_hi = meta->scale1[l.r_hi];
  p_fragments(s, a, scale1_lo, scale1_hi);
  store_p(sp0, a, l);""","""  const float scale1_lo = meta->scale1[l.r_lo], scale1_hi = meta->scale1[l.r_hi];
  if (__any_sync(0xffffffffu, scale1_lo != 1.0f || scale1_hi != 1.0f)) p_fragments(s, a, scale1_lo, scale1_hi);
  store_p(sp0, a, l);""")
if level>=2:  # I2: WG1 issues its own product before storing its P for warpgroup 0
    rep("""    p_fragments(s, a, 1.0f, 1.0f);
    store_p(sp1, a, l);
    multiply_own(o, a, wgmma_desc_mn(stage1 + 4 * kTileElems, kKeys));
    fence_proxy_async();""","""    p_fragments(s, a, 1.0f, 1.0f);
    multiply_own(o, a, wgmma_desc_mn(stage1 + 4 * kTileElems, kKeys));
    store_p(sp1, a, l);
    fence_proxy_async();""")
if level>=3:  # I3: WG0 copies stage 0's tiles 0-3 before waiting for warpgroup 1's softmax
    rep("""  wait_pinned<0>(o, s);
  bar_sync(kBarScale1, 256);
  if (kNext0 && l.t == 0) copy_tiles<0, 4>(p, stage0, meta->tile[0], next0);  // (V's left half and Q K^T are done with them)""","""  wait_pinned<0>(o, s);
  if (kNext0 && l.t == 0) copy_tiles<0, 4>(p, stage0, meta->tile[0], next0);  // (V's left half and Q K^T are done with them)
  bar_sync(kBarScale1, 256);""")
open(p,'w').write(src)
