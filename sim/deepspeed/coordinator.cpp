// The PartitionedParameterCoordinator: fetch and prefetch per module, the parameter trace, and
// release.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/deepspeed/rank_builder.hpp"

// Citations: "DS:file:line" is a line of microsoft/DeepSpeed at tag v0.13.4 unless a version is
// named; PP = runtime/zero/partition_parameters.py, COORD = partitioned_param_coordinator.py,
// PO = parameter_offload.py, S3 = stage3.py. "TF" is transformers 4.35.2's
// models/llama/modeling_llama.py, "PG" PyTorch 2.1's ProcessGroupNCCL.cpp.

namespace hpz::deepspeed {

// COORD:261-391.
void RankBuilder::fetch_sub_module(int module, bool forward) {
  if (trace_ == Trace::kRecord) submodule_order_.push_back(module);  // record_module (PO:447)
  const LabelId saved = label_;
  label_ = module_label_[module];
  // iter_params(module, recurse=z3_leaf_module(module)) (COORD:300 at v0.18.2): its own
  // parameters (PO:60-61), weight before bias; a z3 leaf's whole subtree.
  const std::vector<int>& to_fetch = md_.hooked(module);
  // Kick off the module's own gathers.
  std::vector<int> missing;
  for (int p : to_fetch) {
    if (ps_[p].status == Status::kNotAvailable) missing.push_back(p);
  }
  if (!missing.empty()) {
    purpose_ = Purpose::kParamFetch;
    all_gather_params(missing, forward);
  }
  // Wait for them, inside `with stream(S_ag)`, throttling the host (COORD:296-313).
  purpose_ = Purpose::kFetchWait;
  for (int p : to_fetch) {
    ps_[p].active.insert(module);
    if (ps_[p].handle >= 0) wait_fetched(p);
  }
  // Every hook: the current stream waits for the all-gather stream (COORD:317-318).
  wait_stream(current_, sag_, Purpose::kFetchWait);

  if (trace_ == Trace::kComplete) {
    pop_trace(module, to_fetch);
    prefetch_next(forward);
  }
  ++step_id_;
  label_ = saved;
}

// One fetched parameter's gather waited for on S_ag (COORD:305-313), after the host's throttle.
void RankBuilder::wait_fetched(int p) {
  const StreamId saved_stream = current_;
  current_ = sag_;
  // Event.query() answers "not done" (the recorder's convention, docs/record.md): only
  // the synchronize of the oldest beyond __max_ongoing_fetch_events = 2 happens.
  if (ongoing_fetch_events_.size() > 2) {
    push(OpKind::kHostEventSync, kHostStream, Purpose::kHostThrottle).event =
        ongoing_fetch_events_.front();
    ongoing_fetch_events_.pop_front();
  }
  const int h = ps_[p].handle;
  ps_[p].handle = -1;
  wait_handle(h);
  // `__inflight_param_registry.pop(param).wait()`: the last pop drops the handle, and with
  // it the partitions that keep a coalesced gather's flat tensor alive (PP:640-702), so the
  // allocator takes the flat buffer back (on the stream it was allocated on). A qwZ
  // handle's QuantizationInfo goes with it, after the partitions (attributes go in the
  // order they were set): the int8 gather buffer, then the scales' (PP:1241-1245, 1303-1307).
  if (Handle& hd = handles_[static_cast<std::size_t>(h)]; --hd.registered == 0) {
    if (hd.coalesced && hd.flat != kNoBuffer) free(hd.flat, hd.flat_stream, Purpose::kFetchWait);
    if (hd.quantized) {
      free(hd.qbuf, hd.q_stream, Purpose::kFetchWait);
      free(hd.sbuf, hd.q_stream, Purpose::kFetchWait);
    }
  }
  ongoing_fetch_events_.push_back(record(sag_, Purpose::kFetchWait));
  current_ = saved_stream;
}

// Pop the module's own entries (COORD:327-343).
void RankBuilder::pop_trace(int module, const std::vector<int>& to_fetch) {
  std::set<int> not_fetched;
  for (int p : to_fetch) {
    auto it = most_recent_.find(p);
    if (it == most_recent_.end() || it->second < step_id_) not_fetched.insert(p);
  }
  std::set<int> discarded;
  while (!queue_.empty() && discarded.size() < not_fetched.size()) {
    const TraceEntry e = queue_.front();
    queue_.pop_front();
    most_recent_[e.param] = e.step_id;
    discarded.insert(e.param);
  }
  if (discarded != not_fetched) {
    throw std::logic_error("DeepSpeed builder: the parameter trace diverged at coordinator step " +
                           std::to_string(step_id_) + " (" + md_.modules[module].path + ")");
  }
}

// Prefetch within the per-call budget (COORD:353-386).
void RankBuilder::prefetch_next(bool forward) {
  const std::int64_t bucket = sc_.zero.stage3_prefetch_bucket_size;
  if (bucket > 0) {
    const std::int64_t budget =
        std::min<std::int64_t>(sc_.zero.stage3_max_live_parameters - n_available_, bucket);
    std::vector<int> prefetch;
    std::int64_t numel = 0;
    while (!queue_.empty() && numel < budget) {
      const TraceEntry e = queue_.front();
      queue_.pop_front();
      bool do_prefetch = ps_[e.param].status == Status::kNotAvailable;
      if (std::find(prefetch.begin(), prefetch.end(), e.param) != prefetch.end()) {
        do_prefetch = false;
      }
      auto it = most_recent_.find(e.param);
      most_recent_[e.param] =
          it == most_recent_.end() ? e.step_id : std::max(it->second, e.step_id);
      if (do_prefetch) {
        prefetch.push_back(e.param);
        // Saturating at the budget: near 2^63 the sum overflowed.
        numel += std::min(static_cast<std::int64_t>(md_.params[e.param].numel), budget - numel);
      }
    }
    if (numel > 0) {
      purpose_ = Purpose::kPrefetch;
      all_gather_params(prefetch, forward);
    }
  }
}

// COORD:487-517, lru_cache'd on (module, step_id) for the coordinator's lifetime.
std::set<int> RankBuilder::params_to_release(int module, int step_id) {
  const auto key = std::make_pair(module, step_id);
  if (auto it = release_cache_.find(key); it != release_cache_.end()) return it->second;
  std::set<int> out;
  const std::vector<int>& own_params = md_.hooked(module);
  for (const int own : own_params) {
    if (!md_.params[own].persist) out.insert(own);  // COORD:491-493
  }
  for (const int own : own_params) {
    if (auto it = most_recent_.find(own); it != most_recent_.end() && it->second > step_id) {
      out.erase(own);
    }
  }
  // The scan iterates each later module with recurse=z3_leaf_module(the module released)
  // (COORD:555 at v0.18.2): releasing a leaf, every later module's whole subtree counts;
  // releasing any other, only a later module's own parameters (none for a leaf block).
  const bool recurse = md_.modules[static_cast<std::size_t>(module)].z3_leaf;
  std::int64_t traversed = 0;
  for (std::size_t i = static_cast<std::size_t>(step_id); i < submodule_order_.size(); ++i) {
    const std::int64_t distance = sc_.zero.stage3_max_reuse_distance;
    if (traversed >= distance) break;
    const int later = submodule_order_[i];
    for (const int p : recurse ? md_.below[static_cast<std::size_t>(later)]
                               : md_.modules[static_cast<std::size_t>(later)].params) {
      out.erase(p);
      // Saturating at the distance: a distance near 2^63 overflowed the sum.
      traversed += std::min(static_cast<std::int64_t>(md_.params[p].numel), distance - traversed);
    }
  }
  release_cache_.emplace(key, out);
  return out;
}

// COORD:395-404 and __release_param (COORD:477-484).
void RankBuilder::release_sub_module(int module) {
  const std::vector<int>& own = md_.hooked(module);
  if (own.empty()) return;
  const std::set<int> rel = trace_ == Trace::kComplete ? params_to_release(module, step_id_)
                                                       : std::set<int>(own.begin(), own.end());
  for (const int p : own) {
    ps_[p].active.erase(module);
    if (rel.count(p)) {
      release_param_as(p, module_label_[module]);
    }
  }
}

// release_backward_leftovers (COORD:554-566 at 0.19.8, PR 8148 in v0.19.3), from the stage-3
// optimizer's backward_epilogue (S3:3068), after the engine's allreduce_gradients: the modules
// whose post-backward hook never ran, last recorded first, each parameter but a persistent one
// released as that hook would have.
void RankBuilder::release_backward_leftovers() {
  purpose_ = Purpose::kParamRelease;
  while (!active_backward_.empty()) {
    const int m = active_backward_.back();
    active_backward_.pop_back();
    for (const int p : md_.hooked(m)) {
      ps_[p].active.erase(m);
      if (md_.params[p].persist) continue;
      release_param_as(p, module_label_[m]);
    }
  }
}

// release_param with its ops labelled `label` (the module whose hook releases it, or none).
void RankBuilder::release_param_as(int p, LabelId label) {
  const LabelId saved = label_;
  label_ = label;
  release_param(p);
  label_ = saved;
}

void RankBuilder::release_param(int p) {
  if (ps_[p].status == Status::kAvailable && ps_[p].active.empty()) {
    partition(p);
    n_available_ -= static_cast<std::int64_t>(md_.params[p].numel);
  }
}

// COORD:195-240: the first forward+backward records the trace; reset_step completes it.
void RankBuilder::reset_step() {
  const Purpose p = purpose_;
  // assert_ints_same_as_other_ranks: up to v0.17.5 one broadcast of the list (int64s) from
  // the compute stream (utils.py get_lst_from_rank0); from v0.17.6 (PR 7525) first the length's
  // broadcast and `.item()`, then the list's broadcast and `.item()` of each element (one host
  // sync on a GPU after `.cpu()`; none for an empty list). The recorder logs a broadcast as an
  // all-reduce of the same bytes, as the builder does at init.
  auto assert_ints = [&](std::size_t n) {
    if (v_.length_broadcast_in_trace_check) {
      world_round_trip("rank0_len", 8, true, p);
      world_round_trip("rank0_list", 8 * n, n > 0, p);
    } else {
      const EventId done = collective(OpKind::kAllReduce, world_group_, 8 * n, {});
      wait(current_, done, p);
    }
  };
  if (trace_ != Trace::kComplete) {
    // COORD:210-229 (v0.13.4), 235-254 (v0.17.6): the module order is checked; a recorded
    // trace is completed (its parameter ids and step ids checked too), an invalid one starts
    // recording.
    assert_ints(submodule_order_.size());
    if (trace_ == Trace::kRecord) {
      param_order_.clear();
      for (std::size_t i = 0; i < submodule_order_.size(); ++i) {
        // record_parameters: iter_params(m, recurse=z3_leaf_module(m)) sorted by ds_id
        // (COORD:218 at v0.18.2).
        for (const int q : md_.hooked(submodule_order_[i])) {
          param_order_.push_back({q, static_cast<int>(i)});
        }
      }
      assert_ints(param_order_.size());
      assert_ints(param_order_.size());
      trace_ = Trace::kComplete;
    } else {
      trace_ = Trace::kRecord;
    }
  }
  queue_.assign(param_order_.begin(), param_order_.end());
  most_recent_.clear();
  step_id_ = 0;
  // 0.16.0-0.16.7 keep the count across resets (PR 6726); release_and_reset_all zeroes it.
  if (!v_.available_kept_across_reset) n_available_ = 0;
}

}  // namespace hpz::deepspeed
