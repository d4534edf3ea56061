// bfloat16 storage type: the upper 16 bits of an IEEE float, bit-compatible with oneDNN's and CUDA's bf16.
#pragma once
#include <cstdint>
#include <cstring>

namespace dslab {

struct bf16 {
  uint16_t bits = 0;
};

inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                               // round to nearest even
  return bf16{uint16_t(u >> 16)};
}

inline float to_float(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float round_to_bf16(float f) { return to_float(to_bf16(f)); }

}  // namespace dslab
