// Seeded per-op noise: each op's duration is multiplied by max(0.1, 1 + jitter x N(0, 1)), the
// normal draw a pure function of (seed, rank, op, salt), so a run does not depend on the order
// in which the engine happens to visit ops, and the same seed gives the same run bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

namespace hpz::time {

/** The noise of one run. */
class Jitter {
 public:
  /** `relative_sd` is the scenario's sim.jitter; 0 turns the noise off. */
  Jitter(std::uint64_t seed, double relative_sd) : seed_(seed), sd_(relative_sd) {}

  /** The duration factor of op `op` of rank `rank`; `salt` tells apart draws of one op
   *  (0: its run time, 1: its launch cost on the host). */
  double factor(int rank, std::uint32_t op, std::uint32_t salt) const {
    if (sd_ <= 0) return 1.0;
    std::uint64_t x = mix(seed_ ^ mix((static_cast<std::uint64_t>(rank) << 34) ^
                                      (static_cast<std::uint64_t>(op) << 2) ^ salt));
    const double u1 = (static_cast<double>(mix(x) >> 11) + 0.5) * 0x1.0p-53;
    x += 0x9e3779b97f4a7c15ull;
    const double u2 = (static_cast<double>(mix(x) >> 11) + 0.5) * 0x1.0p-53;
    const double normal = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    const double f = 1.0 + sd_ * normal;
    return f < 0.1 ? 0.1 : f;
  }

 private:
  /** SplitMix64's finaliser. */
  static std::uint64_t mix(std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  std::uint64_t seed_;
  double sd_;
};

}  // namespace hpz::time
