// Why a schedule is clean: which of its syncs order each hpZ secondary copy before the gathers
// that read it (`hpzlab check --explain`, issue 35).
//
// The checker proves "ordered" without saying by what. This finds out by taking syncs away: the
// schedule is checked again with one kind of ordering op left out at a time (check::Ablation),
// and a kind whose absence lets a secondary shard be read unordered with its copy, or stale, is
// one that orders it. Kinds are (op kind, purpose) first: a host stream sync issued for the
// model's forward, the compute stream's wait for a gathered parameter, ... A kind that matters is
// then split by where it was issued (the module whose hook issued it, or whose hook ops it
// follows, with layer numbers taken out), so that "a host read in the model's code" names the
// module: after model.layers.*.block_sparse_moe.gate.
//
// What it does not do: find every path of the happens-before order. Two kinds that each order
// the copies alone show nothing when one is left out; the explanation then says that the copies
// are ordered more than once, and what taking every host sync, or every stream wait, away gives.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "sim/check/checker.hpp"

namespace hpz::check {

/** One kind of ordering op, and what leaving it out does. */
struct OrderingGuard {
  OpKind kind = OpKind::kHostStreamSync;
  Purpose purpose = Purpose::kOther;
  /** Where the ops were issued, layer numbers taken out: "at model.layers.*.mlp" (by that
   *  module's hook), "after model.layers.*.mlp.gate" (unlabelled, after that module's hook ops:
   *  the model's own code), "" (after no hook: the training script), "*" (every place). */
  std::string where;
  std::string what;         ///< a phrase for a person, e.g. "a host read in the model's code"
  std::uint64_t ops = 0;    ///< ops of this kind, every rank
  std::uint64_t races = 0;  ///< secondary races once they are left out
  std::uint64_t stale = 0;  ///< secondary stale reads once they are left out
  /** For a kind issued at several places: each place that gives findings when it alone is
   *  left out (its ops, races and stale reads), most first. */
  std::vector<OrderingGuard> places;
};

/** Which syncs order the secondary copies of a schedule. */
struct OrderExplanation {
  std::uint64_t secondary_copies = 0;  ///< ops writing a kSecondary buffer, every rank
  /** Kinds of ordering op that matter: leaving one out gives secondary findings; most findings
   *  first. Empty when no single kind matters (see `without_*`). */
  std::vector<OrderingGuard> guards;
  std::size_t kinds_tried = 0;  ///< (op kind, purpose) classes and label splits checked
  /** With no single guard: secondary findings with every host sync, and every stream wait,
   *  left out (-1: not tried). */
  std::int64_t without_host_syncs = -1;
  std::int64_t without_stream_waits = -1;
};

/** Explains a schedule the checker found free of secondary findings. `workers` checks run at
 *  once (each holds its own checker state). */
OrderExplanation explain_ordering(const Schedule& schedule, unsigned workers);

/** The secondary findings of a result: races and stale reads on kSecondary buffers. */
std::uint64_t secondary_findings(const CheckResult& result, FindingKind kind);

/** The explanation as text: lines indented by two spaces, ending in a newline. */
std::string explain_text(const OrderExplanation& e);

/** The explanation as JSON (check --json's "explain"). */
nlohmann::json explain_json(const OrderExplanation& e);

}  // namespace hpz::check
