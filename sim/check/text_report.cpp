// The human-readable report of `hpzlab check`.
#include <fmt/format.h>

#include "sim/check/finding_log.hpp"
#include "sim/check/report.hpp"

namespace hpz::check {
namespace {

bool is_hpz_copy_race(const Finding& f) {
  return f.kind == FindingKind::kRace && f.role == BufferRole::kSecondary &&
         (f.first.purpose == Purpose::kSecondaryPartitionCopy ||
          f.second.purpose == Purpose::kSecondaryPartitionCopy);
}

/** ZeRO-1/2's reduction stream (stage_1_and_2.py `reduction_stream`), as the recorder names it:
 *  the findings on it are ZeRO-1/2's own bugs (5545, 7188, 7965), not stage 3's. */
constexpr std::string_view kZero12Reduction = "S_reduction";

bool on_zero12_reduction(const Finding& f) {
  return f.first.stream == kZero12Reduction || f.second.stream == kZero12Reduction;
}

}  // namespace

std::string explain(const Finding& f) {
  switch (f.kind) {
    case FindingKind::kRace:
      if (is_hpz_copy_race(f)) {
        return "This is the ZeRO++ hpZ race fixed in DeepSpeed v0.13.5 (PR 5216). After a layer's "
               "forward, DeepSpeed copies this rank's slice of the weights into the secondary "
               "shard on the compute stream and moves on; later the hpZ all-gather reads the "
               "secondary shard on the all-gather stream, and nothing makes it wait for the copy. "
               "When the compute stream is backlogged the gather sends uninitialized or stale "
               "memory to every GPU of the node, backward computes garbage gradients, and the "
               "loss turns NaN (or 0, or huge) within a step or two. Whether it shows depends on "
               "timing: link speed, prefetch depth and batch size.";
      }
      if (on_zero12_reduction(f)) {
        return "ZeRO-1/2 with overlap_comm: the gradient hook copies each gradient into a bucket "
               "on the compute stream, and a full bucket is divided, gathered and all-reduced on "
               "the reduction stream while backward goes on. Here the compute stream writes a "
               "bucket the reduction stream is still reducing (or the reverse), so the reduced "
               "gradients mix two buckets' values: wrong or NaN gradients on every rank "
               "(DeepSpeed issues 5545 and 7188).";
      }
      return "Two GPU streams touch the same bytes with no event, stream wait or synchronization "
             "between them, and at least one writes. Which one gets there first depends on "
             "timing, so results can silently differ from run to run.";
    case FindingKind::kUseAfterFree:
      return "PyTorch's caching allocator gives a freed tensor's memory to the next allocation "
             "on the stream the tensor was allocated on, at once, unless record_stream() named "
             "the other streams that used it. Here another stream still used the tensor when "
             "the host dropped it, and a new tensor got its memory: the old use and the new "
             "owner touch the same bytes in an order nothing fixes. PyTorch's CUDA sanitizer "
             "does not see this (it tracks tensors, not reused blocks); DeepSpeed's ZeRO-2 NaN "
             "of issue 7965 is one.";
    case FindingKind::kStaleRead:
      return "The hpZ secondary shard still holds weights from before the primary shard was "
             "last written. The backward all-gather hands these old weights to the whole node, "
             "so gradients are computed for weights that no longer exist: training quietly fails "
             "to converge (DeepSpeed issue 4851, secondaries not invalidated after the optimizer "
             "step) or the first step after loading a checkpoint has a much higher loss (issue "
             "7606).";
    case FindingKind::kUninitializedRead:
      if (unwritten_at_init(f)) {
        return "zero.Init broadcasts each parameter as its module's constructor left it, and "
               "this one's constructor made it with torch.empty() and wrote nothing (DeepSeek-V2's "
               "MoE gate in transformers 4.57.1): every rank gets whatever rank 0's memory held. "
               "from_pretrained loads the checkpoint over it afterwards, which this schedule does "
               "not include. A model built from its config keeps those values unless something "
               "writes the gathered parameter: transformers' _init_weights pass writes "
               "param.data, which zero.Init has already replaced by an empty placeholder.";
      }
      return "Part of a buffer is read although nothing wrote it since it was allocated: "
             "torch.empty() returns whatever the caching allocator's block held. For a secondary "
             "shard this is the copy-bounds bug fixed before DeepSpeed v0.13.5: when a parameter's "
             "size is not divisible by the world size, some ranks never copy their slice, and the "
             "hpZ gather spreads garbage to the node.";
    case FindingKind::kCollectiveMismatch:
      return "NCCL pairs the k-th collective of every rank of a group. Here the ranks disagree, "
             "so the job hangs at this collective (or, if the sizes happen to match, exchanges "
             "the wrong tensors). DeepSpeed issue 5030 is this hang: ranks disagreeing on whether "
             "a secondary shard exists gather over different groups.";
  }
  return "";
}

std::string remedy(const Finding& f) {
  const Purpose a = f.first.purpose;
  const Purpose b = f.second.purpose;
  const bool secondary = f.role == BufferRole::kSecondary;
  switch (f.kind) {
    case FindingKind::kRace:
      if (is_hpz_copy_race(f)) {
        return "upgrade DeepSpeed to 0.18.3 or later (or 0.13.5-0.14.2, whose PR 5216 waits for "
               "the copy; 0.14.3-0.18.2 leave the secondary stale after a checkpoint load), or set "
               "zero_optimization.overlap_comm false (the gathers then wait for the compute "
               "stream: less overlap), or zero_hpz_partition_size 1 (hpZ off: backward gathers "
               "cross nodes again)";
      }
      if ((a == Purpose::kBackwardCompute && b == Purpose::kGradReduce) ||
          (a == Purpose::kGradReduce && b == Purpose::kBackwardCompute)) {
        if (!on_zero12_reduction(f)) {
          return "upgrade DeepSpeed to 0.18.8 or later (PR 7897, issue 7898), or run forward and "
                 "backward from the default stream";
        }
        // The gradient hook writes the bucket the reduction still uses: issue 5545 up to
        // 0.14.2, issue 7188 on 0.17.2-0.17.4 (traces/deepspeed/tiny-zero*-5545-*, -7188-*).
        return "upgrade DeepSpeed to 0.17.5 or later, or 0.14.3-0.17.1 (the compute stream must "
               "wait for a reduction before it refills that bucket: PR 5606 in 0.14.3 for issue "
               "5545; 0.17.2-0.17.4 reset the ping-pong bucket's index, issue 7188, which PR 7371 "
               "in 0.17.5 and PR 7805 in 0.18.5 fix), or set zero_optimization.overlap_comm "
               "false";
      }
      break;
    case FindingKind::kUseAfterFree:
      if (f.reused_role == BufferRole::kSecondary) {
        // The hpZ gather reads a secondary whose block S0 may still be writing: the same
        // missing edge as the hpZ race (the copy on S0, the gather elsewhere).
        return "upgrade DeepSpeed to 0.13.5 or later (PR 5216: the host waits for the compute "
               "stream after each secondary copy, which orders the block's earlier use too), or "
               "set zero_hpz_partition_size 1 (hpZ off)";
      }
      if (f.first.stream == kZero12Reduction) {
        // ZeRO-1/2: a gradient the reduction stream still divides or reads, freed by the host
        // (traces/deepspeed/tiny-zero2-7965-*: the gradients of the extra-large path).
        return "no release fixes it on every rank: 0.19.0 (PR 7965) records the reduction "
               "stream only on gradients the rank keeps a slice of, and 0.19.0-0.19.8 still "
               "free the others early; set zero_optimization.reduce_bucket_size to at least "
               "the largest parameter's element count (no gradient then takes the extra-large "
               "path), or overlap_comm false";
      }
      break;
    case FindingKind::kStaleRead:
      if (a == Purpose::kCheckpointLoad) {
        return "upgrade DeepSpeed to 0.18.3 or later (PR 7707 rewrites the secondary after a "
               "load; issue 7606), or set zero_hpz_partition_size 1 (hpZ off); until then the "
               "first steps after a load train on zero.Init's weights";
      }
      if (secondary) {
        return "upgrade DeepSpeed to 0.18.3 or later, or 0.13.5-0.14.2 (the secondary is dropped "
               "after each optimizer step; issue 4851), or set zero_hpz_partition_size 1 (hpZ "
               "off)";
      }
      break;
    case FindingKind::kUninitializedRead:
      if (unwritten_at_init(f)) {
        return "nothing to change in DeepSpeed: load the checkpoint (from_pretrained) or write "
               "the parameter before training; a model trained from its config starts from "
               "whatever memory rank 0 held there";
      }
      if (secondary) return "upgrade DeepSpeed to 0.13.5 or later (the secondary's copy bounds)";
      break;
    case FindingKind::kCollectiveMismatch:
      return "the job would hang here: no setting is known to avoid it; report it to DeepSpeed "
             "with this output (issue 5030 was one)";
  }
  return "no DeepSpeed release or setting is known to avoid it: report it with this output; "
         "`fix` is the edge DeepSpeed would need";
}

namespace {

std::string span_of(const FindingGroup& g) {
  std::set<int> ranks(g.ranks.begin(), g.ranks.end());
  std::string out = fmt::format("ranks {}", format_ranges(ranks));
  if (!g.layers.empty()) out += fmt::format(", layers {}", format_ranges(g.layers));
  out += fmt::format(", steps {}", format_ranges(g.steps));
  return out;
}

std::string verdict_line(const CheckResult& r) {
  const std::string name =
      fmt::format("{} [{}]", r.scenario.empty() ? "schedule" : r.scenario, label_of(r));
  // Pairs left out because their only writes rewrote a secondary with the data it held.
  const std::string rewrites =
      r.stats.same_data_rewrites == 0
          ? ""
          : fmt::format(
                "; {} unordered pair{} left out: a secondary rewritten with the data it "
                "held",
                r.stats.same_data_rewrites, r.stats.same_data_rewrites == 1 ? "" : "s");
  if (r.clean()) {
    return fmt::format(
        "{}: clean: no race, {}stale-read, uninitialized-read or collective-mismatch "
        "({} ranks, {} ops, {} collectives checked{})\n",
        name, r.allocator ? "use-after-free, " : "", r.world_size, r.stats.ops, r.stats.collectives,
        rewrites);
  }
  std::uint64_t total = 0;
  std::string kinds;
  for (FindingKind k : kAllKinds) {
    const std::uint64_t n = r.count(k);
    if (n == 0) continue;
    total += n;
    const std::size_t groups = r.group_count(k);
    kinds += fmt::format("{}{} {} ({} group{})", kinds.empty() ? "" : ", ", n, to_string(k), groups,
                         groups == 1 ? "" : "s");
  }
  return fmt::format("{}: {} finding{}: {}{}\n", name, total, total == 1 ? "" : "s", kinds,
                     rewrites);
}

std::string describe_group(const FindingGroup& g) {
  const Finding& f = g.example;
  std::string out;
  if (f.kind == FindingKind::kCollectiveMismatch) {
    out += fmt::format("  expected: {}\n", describe(f.first));
    out += fmt::format("  but:      {}\n", describe(f.second));
  } else {
    const bool loaded = f.first.purpose == Purpose::kCheckpointLoad;
    const bool uaf = f.kind == FindingKind::kUseAfterFree;
    const char* first_role = f.kind == FindingKind::kRace ? "first: "
                             : uaf                        ? "still used by:"
                             : f.kind == FindingKind::kStaleRead
                                 ? (loaded ? "weights loaded by:" : "primary written by:")
                                 : "allocated by:";
    const char* second_role = f.kind == FindingKind::kRace ? "second:"
                              : uaf                        ? "reused by:"
                                                           : "read by:";
    out += fmt::format("  {} {}\n", first_role, describe(f.first));
    out += fmt::format("  {} {}\n", second_role, describe(f.second));
    out += fmt::format("  buffer: {}\n", describe_bytes(f));
  }
  out += fmt::format("  what:   {}\n", f.detail);
  out += fmt::format("  fix:    {}\n", f.fix);
  out += fmt::format("  to do:  {}\n", remedy(f));
  return out;
}

}  // namespace

std::string label_of(const CheckResult& r) {
  return schedule_label(r.variant, r.source);
}

namespace {

/** Consecutive values as one range: "lo-hi", or "lo" alone. */
struct Range {
  int lo = 0, hi = 0;
  std::string text() const {
    return lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi);
  }
};

}  // namespace

std::string format_ranges(const std::set<int>& values) {
  std::vector<Range> ranges;
  for (const int v : values) {
    if (!ranges.empty() && ranges.back().hi + 1 == v) {
      ranges.back().hi = v;
    } else {
      ranges.push_back({v, v});
    }
  }
  std::string out;
  for (std::size_t i = 0; i < ranges.size();) {
    // A run of ranges of one width, one stride apart (every other rank, or 4 ranks in every 8,
    // past a weight's end at 16,384 GPUs): its first two and its last where that is shorter.
    std::size_t end = i + 1;
    const int width = ranges[i].hi - ranges[i].lo;
    const int stride = end < ranges.size() ? ranges[end].lo - ranges[i].lo : 0;
    while (end < ranges.size() && ranges[end].hi - ranges[end].lo == width &&
           ranges[end].lo - ranges[end - 1].lo == stride) {
      ++end;
    }
    std::string part = ranges[i].text();
    if (end - i >= 3) {
      std::string listed = part;
      for (std::size_t k = i + 1; k < end; ++k) listed += "," + ranges[k].text();
      const std::string collapsed =
          fmt::format("{},{},...,{}", part, ranges[i + 1].text(), ranges[end - 1].text());
      if (collapsed.size() < listed.size()) {
        part = collapsed;
      } else {
        end = i + 1;
      }
    } else {
      end = i + 1;
    }
    if (!out.empty()) out += ",";
    out += part;
    i = end;
  }
  return out.empty() ? "none" : out;
}

std::string TextReporter::render_one(const CheckResult& r) const {
  std::string out = verdict_line(r);
  if (r.clean()) return out;
  const FindingGroup& worst = r.groups.front();
  out += fmt::format("\nWorst: {}, {} time{} ({})\n", to_string(worst.example.kind), worst.count,
                     worst.count == 1 ? "" : "s", span_of(worst));
  out += fmt::format("  {}\n", explain(worst.example));
  out += describe_group(worst);
  if (r.groups.size() > 1) {
    out += fmt::format("\nOther findings ({} group{}):\n", r.groups.size() - 1,
                       r.groups.size() == 2 ? "" : "s");
    for (std::size_t i = 1; i < r.groups.size(); ++i) {
      const FindingGroup& g = r.groups[i];
      out += fmt::format("\n- {}, {} time{} ({})\n", to_string(g.example.kind), g.count,
                         g.count == 1 ? "" : "s", span_of(g));
      out += describe_group(g);
    }
  }
  return out;
}

std::string TextReporter::render(std::span<const CheckResult> results) const {
  std::string out;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (i > 0) out += "\n";
    out += render_one(results[i]);
  }
  return out;
}

}  // namespace hpz::check
