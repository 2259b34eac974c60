// Host conversions between float and the 16-bit storage types (bf16, f16),
// round-to-nearest-even, bit-exact with the GPU's cvt.rn.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace kdtree::ref {

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float bf16_to_float(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (mag >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (rounds to inf)
  if (mag < 0x38800000u) {                                  // subnormal or zero
    float a;
    std::memcpy(&a, &mag, 4);
    uint32_t v = uint32_t(std::nearbyint(a * 16777216.0f));  // 2^24
    return uint16_t(sign | v);
  }
  uint32_t e = ((mag >> 23) - 112) << 10;
  uint32_t m = (mag >> 13) & 0x3ffu;
  uint32_t rest = mag & 0x1fffu;
  uint32_t h = e | m;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  float f;
  if (e == 0) {
    f = std::ldexp(float(m), -24);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u = sign | (e == 31 ? (0xffu << 23) | (m << 13) : ((e + 112) << 23) | (m << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

// dtype: 0 = bf16, 1 = f16 (kdtree_dtype values).
inline uint16_t to_half(float f, int dtype) { return dtype == 0 ? float_to_bf16(f) : float_to_f16(f); }
inline float from_half(uint16_t h, int dtype) { return dtype == 0 ? bf16_to_float(h) : f16_to_float(h); }

}  // namespace kdtree::ref
