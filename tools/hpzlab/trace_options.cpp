// --trace, --trace-ranks and --trace-steps of `hpzlab sim` and `hpzlab real`.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/input.hpp"
#include "tools/hpzlab/commands.hpp"

namespace hpz::cli {
namespace {

/** "0,2,8-11" as numbers, each from 0 to `limit` - 1; `flag` and `what` name them in errors. */
std::vector<int> number_list(const std::string& text, const std::string& flag, int limit,
                             const std::string& what) {
  std::vector<int> out;
  const std::string allowed =
      fmt::format("allowed: {}s from 0 to {}, comma-separated, ranges A-B", what, limit - 1);
  std::size_t from = 0;
  while (from <= text.size()) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string part = text.substr(from, comma - from);
    from = comma + 1;
    const std::size_t dash = part.find('-', 1);
    int lo = 0;
    int hi = 0;
    const auto number = [&](const std::string& t, int& n) {
      const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), n);
      return ec == std::errc() && end == t.data() + t.size() && n >= 0 && n < limit;
    };
    const bool ok = dash == std::string::npos ? number(part, lo) && number(part, hi)
                                              : number(part.substr(0, dash), lo) &&
                                                    number(part.substr(dash + 1), hi) && lo <= hi;
    if (!ok) throw InputError("", flag, fmt::format("'{}' is not a {} ({})", part, what, allowed));
    for (int n = lo; n <= hi; ++n) {
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    }
  }
  return out;
}

}  // namespace

void add_trace_options(CLI::App& sub, TraceOptions& opts, const std::string& of) {
  sub.add_option(
      "--trace", opts.file,
      "Write a Chrome trace-event JSON " + of + " to FILE (open in Perfetto); FILE.gz: gzip'd");
  sub.add_option("--trace-ranks", opts.ranks,
                 "The ranks the trace shows, e.g. 0,8 or 0-3 (default: every rank)");
  sub.add_option("--trace-steps", opts.steps,
                 "The steps the trace shows, e.g. 1 or 0-1 (default: every step; init's ops "
                 "belong to none)");
}

time::TraceFilter trace_filter(const TraceOptions& opts, const Schedule& schedule) {
  time::TraceFilter filter;
  if (!opts.ranks.empty()) {
    filter.ranks =
        number_list(opts.ranks, "--trace-ranks", static_cast<int>(schedule.ranks.size()), "rank");
  }
  if (!opts.steps.empty()) {
    filter.steps = number_list(opts.steps, "--trace-steps", step_count(schedule), "step");
  }
  return filter;
}

void write_trace(const TraceOptions& opts, const std::string& trace) {
  // A 7B trace shrinks about tenfold.
  const bool gz = opts.file.size() > 3 && opts.file.ends_with(".gz");
  write_output(opts.file, gz ? gzipped(trace) : trace, "--trace");
}

}  // namespace hpz::cli
