// Host conversions between float and fp8 e4m3 (OCP e4m3fn: bias 7, 3 mantissa
// bits, no infinities, NaN = S.1111.111, largest finite 448), the format of
// kdtree's e4m3 KV caches. The one host definition: the reference, the test
// cases and the benchmarks all encode and decode through it.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

namespace kdtree::ref {

constexpr uint8_t kE4m3Nan = 0x7f;      // the positive NaN code (0xff is the negative one)
constexpr uint8_t kE4m3MaxCode = 0x7e;  // 448 = 1.75 x 2^8
constexpr double kE4m3Max = 448.0;

// Exact: every e4m3 value is a float.
inline float e4m3_to_float(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  const bool negative = (code & 0x80) != 0;
  if (exponent == 0xf && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Subnormals (exponent 0): mantissa x 2^-9; normals: (8 + mantissa) x 2^(exponent - 10).
  const float magnitude =
      exponent == 0 ? std::ldexp(float(mantissa), -9) : std::ldexp(float(8 + mantissa), exponent - 10);
  return negative ? -magnitude : magnitude;
}

// Round to nearest, ties to even; magnitudes past 448 (infinities included)
// saturate to +-448, as the GPU's cvt.rn.satfinite does. NaN stays NaN.
inline uint8_t float_to_e4m3(float f) {
  if (std::isnan(f)) return std::signbit(f) ? uint8_t(0x80 | kE4m3Nan) : kE4m3Nan;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const double a = std::fabs(double(f));
  if (a >= kE4m3Max) return uint8_t(sign | kE4m3MaxCode);
  int code;
  if (a < std::ldexp(1.0, -6)) {
    // Subnormal range: a multiple of 2^-9; 8 x 2^-9 rounds up into code 0x08, the
    // smallest normal, which is what the carry into the exponent field spells.
    code = int(std::nearbyint(a * 512.0));
  } else {
    int e;
    const double fraction = std::frexp(a, &e);  // a = fraction x 2^e, fraction in [0.5, 1)
    // a = (1 + m / 8) x 2^(e - 1): m in [0, 8), rounded; m = 8 carries into the exponent.
    const int m = int(std::nearbyint((fraction * 2.0 - 1.0) * 8.0));
    code = ((e - 1 + 7) << 3) + m;
  }
  // Below 448 the rounding stays at or under 0x7e (448 itself was handled above,
  // and 416 < a < 448 rounds to 416 or 448).
  return uint8_t(sign | code);
}

}  // namespace kdtree::ref
