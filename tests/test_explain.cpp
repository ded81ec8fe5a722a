// check --explain (sim/check/explain.hpp): what orders a clean schedule's secondary copies,
// found by leaving kinds of sync out (check::Ablation).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/check/checker.hpp"
#include "sim/check/explain.hpp"
#include "sim/scenario.hpp"
#include "sim/ir/schedule_json.hpp"
#include "tests/paths.hpp"

namespace hpz::check {
namespace {

Schedule data_schedule(const std::string& name) {
  return read_schedule_file(test::source_dir() + "/tests/data/schedule/" + name);
}

// Leaving out the one host event sync of host-event-sync.json is host-event-sync-missing.json:
// the same race, found the same way.
TEST(Ablation, LeavingOutASyncIsTheScheduleWithoutIt) {
  const Schedule s = data_schedule("host-event-sync.json");
  ASSERT_TRUE(check_schedule(s).clean());
  Ablation ab;
  ab.leave_out = [](Rank, std::uint32_t, const Op& op) {
    return op.kind == OpKind::kHostEventSync;
  };
  const CheckResult without = check_schedule(s, ab);
  const CheckResult missing = check_schedule(data_schedule("host-event-sync-missing.json"));
  ASSERT_EQ(without.count(FindingKind::kRace), 1u);
  EXPECT_EQ(missing.count(FindingKind::kRace), 1u);
  EXPECT_EQ(without.groups[0].example.buffer, missing.groups[0].example.buffer);
  EXPECT_EQ(without.groups[0].example.second.stream, missing.groups[0].example.second.stream);
  // Leaving out nothing of the kind an Ablation may leave out changes nothing.
  ab.leave_out = [](Rank, std::uint32_t, const Op& op) { return op.kind == OpKind::kCopy; };
  EXPECT_TRUE(check_schedule(s, ab).clean());
}

Schedule deepspeed_tiny(const std::string& version, std::vector<Override> sets = {}) {
  sets.emplace_back("run.builder", "deepspeed");
  sets.emplace_back("zero.deepspeed_version", version);
  return build_schedule(load_scenario(test::scenario_path("tiny"), sets));
}

// DeepSpeed 0.13.5 syncs the host after every secondary copy (PR 5216): that sync, and only it,
// orders the copies; without it the 0.13.4 race is back.
TEST(Explain, DeepSpeed0135OrdersTheCopiesWithItsOwnSync) {
  const Schedule s = deepspeed_tiny("0.13.5");
  ASSERT_TRUE(check_schedule(s).clean());
  const OrderExplanation e = explain_ordering(s, 2);
  EXPECT_GT(e.secondary_copies, 0u);
  ASSERT_EQ(e.guards.size(), 1u) << explain_text(e);
  EXPECT_EQ(e.guards[0].purpose, Purpose::kFixHostSync);
  EXPECT_GT(e.guards[0].races, 0u);
  // Issued at every module's release; a place alone leaves fewer races than the whole kind.
  for (const OrderingGuard& p : e.guards[0].places) {
    EXPECT_EQ(p.where.rfind("at model.", 0), 0u) << p.where;
    EXPECT_LE(p.races, e.guards[0].races);
  }
  const std::string text = explain_text(e);
  EXPECT_NE(text.find("DeepSpeed's host sync after the secondary copy"), std::string::npos) << text;
  EXPECT_NE(text.find("DeepSpeed orders the copies itself"), std::string::npos) << text;
  EXPECT_EQ(explain_json(e)["guards"][0]["deepspeed_fix"], true);
}

// Without hpZ there is no secondary shard: nothing is checked again.
TEST(Explain, WithoutHpzThereIsNothingToOrder) {
  const Schedule s = deepspeed_tiny("0.13.4", {{"zero.zero_hpz_partition_size", "1"}});
  ASSERT_TRUE(check_schedule(s).clean());
  const OrderExplanation e = explain_ordering(s, 1);
  EXPECT_EQ(e.secondary_copies, 0u);
  EXPECT_EQ(e.kinds_tried, 0u);
  EXPECT_NE(explain_text(e).find("no hpZ secondary shard"), std::string::npos);
}

// Real DeepSpeed 0.13.4 on a tiny Mixtral (transformers 4.51.3) is clean only because of the
// model: MixtralSparseMoeBlock's torch.where before each expert reads a count on the host.
// The recording says so as the builder does: the host reads after an expert's last hook.
TEST(Explain, RecordedMixtralOn0134IsOrderedByTheModelsHostReads) {
  const Schedule s = read_schedule_file(test::source_dir() +
                                        "/traces/deepspeed/tiny-mixtral-tf4.51-0.13.4.json.gz");
  ASSERT_TRUE(check_schedule(s).clean());
  const OrderExplanation e = explain_ordering(s, 2);
  ASSERT_FALSE(e.guards.empty());
  const OrderingGuard& top = e.guards[0];
  EXPECT_EQ(top.kind, OpKind::kHostStreamSync);
  EXPECT_EQ(top.purpose, Purpose::kForwardCompute);
  EXPECT_GT(top.races, 0u);
  // Of the forward's host syncs, the reads between experts matter alone; the script's batch
  // copy (after no hook) does not.
  ASSERT_FALSE(top.places.empty()) << explain_text(e);
  EXPECT_EQ(top.places[0].where, "after model.layers.*.block_sparse_moe.experts.*.w2");
  for (const OrderingGuard& p : top.places) EXPECT_NE(p.where, "");
  for (const OrderingGuard& g : e.guards) EXPECT_NE(g.purpose, Purpose::kFixHostSync);
  EXPECT_NE(explain_text(e).find("fragile"), std::string::npos);
}

}  // namespace
}  // namespace hpz::check
