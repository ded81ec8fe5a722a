// What a freshly allocated buffer holds: the IR's allocations carry it (Op::fill), and a
// scenario chooses it for the whole run (run.fill). Its own header so that the scenario and the
// IR share it without depending on each other.
#pragma once

namespace hpz {

/** What a freshly allocated buffer holds before anything writes it. */
enum class Fill {
  kNan,    ///< poisoned with NaN (what a race test does on purpose)
  kStale,  ///< whatever the caching allocator's block last held
  kZero,   ///< zeros
};

/** "nan", "stale" or "zero". */
const char* to_string(Fill f);

}  // namespace hpz
