// The synthetic parameter pattern, one definition for the host and the device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HPZ_HOST_DEVICE __host__ __device__
#else
#define HPZ_HOST_DEVICE
#endif

namespace hpz::real {

/** Element `i` of unit `unit` under `salt`: a 64-bit mix (splitmix64's finalizer) of the three,
 *  mapped to [-1, 1) with 10 significant bits, so that fp16 stores it exactly. */
HPZ_HOST_DEVICE inline float pattern_bits(std::uint32_t salt, std::int32_t unit, std::uint64_t i) {
  std::uint64_t x = i + 0x9e3779b97f4a7c15ULL * (static_cast<std::uint64_t>(unit) + 1) +
                    (static_cast<std::uint64_t>(salt) << 56);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return static_cast<float>(static_cast<std::int64_t>(x >> 54) - 512) / 512.0F;
}

}  // namespace hpz::real
