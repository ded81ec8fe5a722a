// Element storage on the host: fp32 as is, 16-bit formats as IEEE binary16 (the executor stores
// every 2-byte dtype as fp16; its synthetic values have 10 significant bits, so nothing is lost).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace hpz::real {

/** binary16 bits to float (exact). */
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000U) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fU;
  const std::uint32_t man = h & 0x3ffU;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000U | (man << 13));  // inf, NaN
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign != 0 ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

/** float to binary16 bits, rounding to nearest even (what CUDA's __float2half_rn does). */
inline std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000U);
  const std::uint32_t abs = x & 0x7fffffffU;
  if (abs > 0x7f800000U) return static_cast<std::uint16_t>(sign | 0x7e00U);   // NaN
  if (abs >= 0x477ff000U) return static_cast<std::uint16_t>(sign | 0x7c00U);  // overflow: inf
  if (abs < 0x38800000U) {  // subnormal or zero in fp16: round abs / 2^-24 to an integer
    const float v = std::bit_cast<float>(abs) * 16777216.0F;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(v)));
  }
  const std::uint32_t rounded = abs + 0xfffU + ((abs >> 13) & 1U);
  return static_cast<std::uint16_t>(sign | ((rounded - 0x38000000U) >> 13));
}

/** Reads element i of a buffer of `eb`-byte elements as float. */
inline float load(const std::uint8_t* base, std::uint64_t i, int eb) {
  if (eb == 4) {
    float f;
    std::memcpy(&f, base + i * 4, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, base + i * 2, 2);
  return half_to_float(h);
}

/** Writes element i. */
inline void store(std::uint8_t* base, std::uint64_t i, int eb, float v) {
  if (eb == 4) {
    std::memcpy(base + i * 4, &v, 4);
    return;
  }
  const std::uint16_t h = float_to_half(v);
  std::memcpy(base + i * 2, &h, 2);
}

/** Whether `bits`, a binary16 (std::uint16_t) or binary32 (std::uint32_t) value, is a NaN:
 *  all exponent bits set and a nonzero mantissa. Branch-free, so loops over it vectorize. */
template <typename T>
constexpr bool is_nan_bits(T bits) {
  constexpr bool half = sizeof(T) == 2;
  constexpr auto exponent = static_cast<T>(half ? 0x7c00U : 0x7f800000U);
  constexpr auto mantissa = static_cast<T>(half ? 0x03ffU : 0x007fffffU);
  return (bits & exponent) == exponent && (bits & mantissa) != 0;
}

/** Whether element i of a buffer of `eb`-byte elements is a NaN. */
inline bool is_nan_bits(const std::uint8_t* base, std::uint64_t i, int eb) {
  if (eb == 4) {
    std::uint32_t x;
    std::memcpy(&x, base + i * 4, 4);
    return is_nan_bits(x);
  }
  std::uint16_t h;
  std::memcpy(&h, base + i * 2, 2);
  return is_nan_bits(h);
}

}  // namespace hpz::real
