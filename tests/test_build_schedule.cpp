// Properties of every schedule build_schedule gives, whatever the release's rules: the same
// scenario gives the same schedule, the seed changes none of it, and ranks that issue alike share
// one copy of their ops (OpList). (The DeepSpeed builder's own order: test_deepspeed_builder.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/builder.hpp"
#include "sim/deepspeed/derive.hpp"
#include "sim/deepspeed_builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/schedule_json.hpp"
#include "sim/scenario.hpp"
#include "tests/paths.hpp"

namespace hpz {
namespace {

/** 2 nodes x 4 GPUs, hpZ 4, the tiny model with every parameter partitioned. */
Scenario small() {
  Scenario sc;
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 4;
  sc.cluster.gpu = gpu_preset("a100-80g");
  sc.model = model_preset("tiny");
  sc.training.seq_len = 16;
  sc.zero.zero_hpz_partition_size = 4;
  sc.zero.stage3_param_persistence_threshold = 0;
  // A tiny model fits in one prefetch bucket: the prefetcher would gather everything up front
  // and nothing would be released. These limits make it behave like a large model does.
  sc.zero.stage3_max_reuse_distance = 0;
  sc.zero.stage3_prefetch_bucket_size = 1;
  return sc;
}

TEST(Builder, SameScenarioGivesTheSameSchedule) {
  EXPECT_EQ(schedule_to_json(build_schedule(small())), schedule_to_json(build_schedule(small())));
}

// The seed moves simulated times (jitter) and replayed data, never the schedule: hpzlab repro
// builds one schedule per variant and replays it under every seed.
TEST(Builder, TheSeedDoesNotChangeTheSchedule) {
  Scenario sc = small();
  const nlohmann::json a = schedule_to_json(build_schedule(sc));
  sc.run.seed = 12345;
  EXPECT_EQ(schedule_to_json(build_schedule(sc)), a);
}

// Ranks that issue the same ops on their own groups share one copy (OpList): a reader sees each
// rank's own groups, a write gives the rank its own copy, and lists that differ (in anything but
// the groups, or with groups that do not correspond one for one) are not shared.
Op collective_on(GroupId g) {
  Op op;
  op.kind = OpKind::kAllGather;
  op.group = g;
  op.comm_bytes = 64;
  return op;
}

TEST(OpList, SharesEqualOpsAndReadsEachRanksOwnGroups) {
  OpList a, b;
  for (GroupId g : {0, 2, 0, kNoGroup}) a.push_back(g == kNoGroup ? Op{} : collective_on(g));
  for (GroupId g : {1, 3, 1, kNoGroup}) b.push_back(g == kNoGroup ? Op{} : collective_on(g));
  ASSERT_TRUE(b.share_if_same(a));
  EXPECT_TRUE(b.shares_with(a));
  EXPECT_EQ(b[0].group, 1);
  EXPECT_EQ(b[1].group, 3);
  EXPECT_EQ(b[2].group, 1);
  EXPECT_EQ(b[3].group, kNoGroup);
  EXPECT_EQ(a[1].group, 2);
  std::vector<GroupId> seen;
  for (const Op& op : b) seen.push_back(op.group);
  EXPECT_EQ(seen, (std::vector<GroupId>{1, 3, 1, kNoGroup}));
  // A write: b gets its own copy with its groups in place; a is untouched.
  b.mut()[0].comm_bytes = 128;
  EXPECT_FALSE(b.shares_with(a));
  EXPECT_EQ(b[0].group, 1);
  EXPECT_EQ(b[1].group, 3);
  EXPECT_EQ(a[0].comm_bytes, 64u);
  EXPECT_EQ(a[0].group, 0);
  // A third list sharing b's copy through a shares a's copy and maps from a's groups.
  OpList c;
  for (GroupId g : {5, 6, 5, kNoGroup}) c.push_back(g == kNoGroup ? Op{} : collective_on(g));
  ASSERT_TRUE(c.share_if_same(a));
  OpList d;
  for (GroupId g : {7, 8, 7, kNoGroup}) d.push_back(g == kNoGroup ? Op{} : collective_on(g));
  ASSERT_TRUE(d.share_if_same(c));
  EXPECT_TRUE(d.shares_with(a));
  EXPECT_EQ(d[1].group, 8);
}

TEST(OpList, DoesNotShareWhatDiffers) {
  OpList a;
  for (GroupId g : {0, 2, 0}) a.push_back(collective_on(g));
  OpList two_for_one;  // a's group 0 would be both 1 and 4
  for (GroupId g : {1, 3, 4}) two_for_one.push_back(collective_on(g));
  EXPECT_FALSE(two_for_one.share_if_same(a));
  EXPECT_EQ(two_for_one[2].group, 4);
  OpList other_bytes;
  for (GroupId g : {0, 2, 0}) other_bytes.push_back(collective_on(g));
  other_bytes.mut()[1].comm_bytes = 1;
  EXPECT_FALSE(other_bytes.share_if_same(a));
  OpList none_for_some;  // no group where a has one
  none_for_some.push_back(collective_on(0));
  none_for_some.push_back(Op{});
  none_for_some.push_back(collective_on(0));
  EXPECT_FALSE(none_for_some.share_if_same(a));
  OpList shorter;
  shorter.push_back(collective_on(0));
  EXPECT_FALSE(shorter.share_if_same(a));
}

// OpMatcher takes a rank's ops one at a time (how the builder issues them): while they match,
// the rank keeps none of its own; from the first that differs, prefix() gives what it issued so
// far with its own groups.
TEST(OpMatcher, MatchesOneAtATimeAndGivesThePrefixOnTheRanksGroups) {
  OpList a;
  for (GroupId g : {0, 2, 0, kNoGroup}) a.push_back(g == kNoGroup ? Op{} : collective_on(g));
  OpMatcher same(a);
  for (GroupId g : {1, 3, 1, kNoGroup}) {
    ASSERT_TRUE(same.add(g == kNoGroup ? Op{} : collective_on(g)));
  }
  const OpList shared = same.shared();
  EXPECT_TRUE(shared.shares_with(a));
  EXPECT_EQ(shared[2].group, 1);
  EXPECT_EQ(shared[1].group, 3);

  OpMatcher differs(a);
  ASSERT_TRUE(differs.add(collective_on(5)));
  ASSERT_TRUE(differs.add(collective_on(6)));
  EXPECT_FALSE(differs.add(collective_on(7)));  // a's group 0 is already our 5
  EXPECT_FALSE(differs.matching());
  EXPECT_FALSE(differs.add(collective_on(5)));  // stays unmatched
  EXPECT_EQ(differs.matched(), 2u);
  const std::vector<Op> prefix = differs.prefix();
  ASSERT_EQ(prefix.size(), 2u);
  EXPECT_EQ(prefix[0].group, 5);
  EXPECT_EQ(prefix[1].group, 6);
  EXPECT_THROW((void)differs.shared(), std::logic_error);

  OpMatcher longer(a);  // one op past a's end
  for (GroupId g : {0, 2, 0, kNoGroup}) {
    ASSERT_TRUE(longer.add(g == kNoGroup ? Op{} : collective_on(g)));
  }
  EXPECT_FALSE(longer.add(Op{}));
  EXPECT_EQ(longer.prefix().size(), 4u);
  OpMatcher shorter(a);
  ASSERT_TRUE(shorter.add(collective_on(0)));
  EXPECT_THROW((void)shorter.shared(), std::logic_error);
}

// A rank's accesses are a base shared with another rank plus own copies of the ops' blocks
// that differ: every way of reading them gives what the rank's plain list held, and a write
// makes the list plain again.
TEST(AccessList, SharesEqualBlocksAndReadsEachRanksOwn) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    // Ops with 0 to 3 accesses each; the second rank differs in some ops' offsets.
    OpList ops;
    std::vector<Access> first, second;
    std::size_t differing = 0;  // the accesses of the ops whose blocks differ
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      Op op;
      op.access_begin = static_cast<std::uint32_t>(first.size());
      op.access_count = static_cast<std::uint32_t>(rng() % 4);
      const bool differs = rng() % 3 == 0;
      if (differs) differing += op.access_count;
      for (std::uint32_t k = 0; k < op.access_count; ++k) {
        const Access a{static_cast<BufferId>(rng() % 5), AccessMode::kRead, rng() % 100, 8};
        first.push_back(a);
        Access b = a;
        if (differs && (k == 0 || rng() % 2 == 0)) b.offset += 1000;
        second.push_back(b);
      }
      ops.push_back(op);
    }
    const AccessList base(first);
    AccessList list(second);
    const OpList same_ops = ops;  // the second rank reads the first's op list
    ASSERT_TRUE(same_ops.shares_with(ops));
    list.share_blocks(base, same_ops, ops);
    ASSERT_TRUE(list.shares_with(base) || first.empty());
    EXPECT_EQ(list.own_count(), differing);
    ASSERT_EQ(list.size(), second.size());
    EXPECT_TRUE(std::equal(list.begin(), list.end(), second.begin(), second.end()));
    for (std::size_t i = 0; i < second.size(); ++i) {
      ASSERT_EQ(list[i], second[i]) << "access " << i;
      ASSERT_EQ(list.index_of(&list[i]), i);
    }
    for (const Op& op : ops) {
      const std::span<const Access> block = list.block(op.access_begin, op.access_count);
      ASSERT_TRUE(std::equal(block.begin(), block.end(), second.begin() + op.access_begin,
                             second.begin() + op.access_begin + op.access_count));
      for (std::size_t k = 0; k < block.size(); ++k) {
        ASSERT_EQ(list.index_of(&block[k]), op.access_begin + k);
      }
    }
    // Iterators that start inside the list read on from there.
    for (std::size_t i = 0; i < second.size(); ++i) {
      ASSERT_TRUE(std::equal(AccessList::const_iterator(&list, i), list.end(),
                             second.begin() + static_cast<std::ptrdiff_t>(i), second.end()));
    }
    // A write gives the rank a plain list of its own; the base is untouched.
    AccessList written = list;
    if (!second.empty()) {
      written.mut()[0].bytes = 16;
      EXPECT_FALSE(written.shares_with(base));
      EXPECT_EQ(written.own_count(), 0u);
      EXPECT_EQ(written[0].bytes, 16u);
      EXPECT_TRUE(std::equal(AccessList::const_iterator(&written, 1), written.end(),
                             second.begin() + 1, second.end()));
      EXPECT_EQ(base[0], first[0]);
      EXPECT_EQ(list[0], second[0]);
    }
  }
}

// Own blocks are kept only for ops whose blocks ascend and are disjoint (what builders and the
// JSON reader make); a list whose ops point back into earlier accesses stays plain and whole.
// A list made on another's base reads the base but where blocks of its own are put in, which
// must ascend without overlapping and stay inside the list; a list made on another's copy of ops
// reads them on the groups it pairs.
TEST(AccessList, ReadsItsOwnBlocksPutOnAnothersBase) {
  const std::vector<Access> first = {{0, AccessMode::kRead, 0, 8},
                                     {1, AccessMode::kRead, 8, 8},
                                     {1, AccessMode::kWrite, 16, 8},
                                     {2, AccessMode::kRead, 24, 8}};
  const AccessList base(first);
  AccessList list = AccessList::on_base_of(base);
  EXPECT_TRUE(list.shares_with(base));
  const std::vector<Access> own = {{1, AccessMode::kRead, 40, 8}, {1, AccessMode::kWrite, 48, 8}};
  list.add_own_block(1, own);
  EXPECT_EQ(list.own_count(), 2u);
  const std::vector<Access> want = {first[0], own[0], own[1], first[3]};
  EXPECT_TRUE(std::equal(list.begin(), list.end(), want.begin(), want.end()));
  EXPECT_EQ(list.block(1, 2)[1], own[1]);
  EXPECT_EQ(list.base_block(1, 2)[1], first[2]);
  EXPECT_THROW(list.add_own_block(2, std::span<const Access>(own).first(1)), std::logic_error);
  EXPECT_THROW(list.add_own_block(3, own), std::logic_error);  // past the end
  list.add_own_block(3, std::span<const Access>(own).first(1));
  EXPECT_EQ(list[3], own[0]);
  EXPECT_EQ(base[3], first[3]);

  OpList ops;
  ops.push_back(collective_on(0));
  ops.push_back(collective_on(2));
  const OpList theirs = OpList::sharing(ops, {{0, 5}, {2, 2}});
  EXPECT_TRUE(theirs.shares_with(ops));
  EXPECT_EQ(theirs[0].group, 5);
  EXPECT_EQ(theirs[1].group, 2);
  EXPECT_EQ(ops[0].group, 0);
}

TEST(AccessList, OpsThatPointBackKeepTheListPlain) {
  const Access a{0, AccessMode::kRead, 0, 8}, b{1, AccessMode::kWrite, 8, 8};
  Access moved = b;
  moved.offset = 64;
  for (const std::uint32_t second_begin : {0u, 1u}) {  // before or inside the first op's block
    OpList ops;
    Op first_op, second_op;
    first_op.access_begin = 0;
    first_op.access_count = 2;
    second_op.access_begin = second_begin;
    second_op.access_count = 1;
    ops.push_back(first_op);
    ops.push_back(second_op);
    const std::vector<Access> mine = {a, moved};
    const AccessList base(std::vector<Access>{a, b});
    AccessList list(mine);
    const OpList same_ops = ops;
    list.share_blocks(base, same_ops, ops);
    EXPECT_FALSE(list.shares_with(base)) << second_begin;
    EXPECT_EQ(list.own_count(), 0u);
    EXPECT_TRUE(std::equal(list.begin(), list.end(), mine.begin(), mine.end()));
  }
}

// The builder gives every rank of a 2 x 4 world one copy of the ops, and each rank's
// collectives still run on groups it belongs to.
TEST(OpList, TheBuilderSharesOneCopyAndEveryRankReadsItsOwnGroups) {
  Scenario sc = small();
  sc.zero.zero_quantized_gradients = true;
  const Schedule s = build_schedule(sc);
  for (Rank r = 1; r < s.world_size; ++r) {
    EXPECT_TRUE(s.ranks[r].ops.shares_with(s.ranks[0].ops)) << "rank " << r;
    EXPECT_TRUE(s.ranks[r].buffers.shares_with(s.ranks[0].buffers)) << "rank " << r;
    // Their accesses too, but for the ops whose bytes are the rank's own (its slice's offset).
    EXPECT_TRUE(s.ranks[r].accesses.shares_with(s.ranks[0].accesses)) << "rank " << r;
    EXPECT_GT(s.ranks[r].accesses.own_count(), 0u) << "rank " << r;
    EXPECT_LT(s.ranks[r].accesses.own_count() * 2, s.ranks[r].accesses.size()) << "rank " << r;
  }
  for (Rank r = 0; r < s.world_size; ++r) {
    std::size_t collectives = 0;
    for (const Op& op : s.ranks[r].ops) {
      if (!is_collective(op.kind)) continue;
      ++collectives;
      const std::vector<Rank>& members = s.groups.at(op.group).ranks;
      ASSERT_TRUE(std::binary_search(members.begin(), members.end(), r))
          << "rank " << r << " runs a collective on " << s.groups[op.group].name;
    }
    EXPECT_GT(collectives, 0u);
  }
}

// Where a parameter's secondary slice at some hpZ position lies entirely in the padding, that
// position's ranks copy nothing into it, so they issue other ops than rank 0. Each rank then
// shares one copy with the same position of the node before it (the rank one hpZ group
// earlier), not with rank 0: one whole copy per position, not one per rank (16,384 GPUs of
// llama2-70b.toml are such a world).
TEST(OpList, RanksOfOneHpzPositionShareOneCopyWhereTheirSlicesFallInThePadding) {
  Scenario sc = small();
  // World 128: the norm weights' 64 elements are padded to 128, so the secondary slices of
  // hpZ positions 2 and 3 ([64, 96) and [96, 128)) are padding.
  sc.cluster.nodes = 32;
  const Schedule s = build_schedule(sc);
  const Rank hpz = s.hpz_size;
  ASSERT_EQ(hpz, 4);
  EXPECT_TRUE(s.ranks[1].ops.shares_with(s.ranks[0].ops));
  EXPECT_FALSE(s.ranks[2].ops.shares_with(s.ranks[0].ops));
  EXPECT_LT(s.ranks[2].ops.size(), s.ranks[0].ops.size());  // the copies it does not issue
  // All but the ranks of the node where the norm weights' primary slices (one element each on
  // ranks 0-63) turn to padding, ranks 64-67: they issue other ops than the node before.
  std::size_t own = 0;
  for (Rank r = hpz; r < s.world_size; ++r) {
    const RankSchedule& before = s.ranks[r - hpz];
    const bool alike = r < 64 || r >= 68;
    EXPECT_EQ(s.ranks[r].ops.shares_with(before.ops), alike) << "rank " << r;
    EXPECT_EQ(s.ranks[r].accesses.shares_with(before.accesses), alike) << "rank " << r;
    if (!alike) continue;
    EXPECT_TRUE(s.ranks[r].buffers.shares_with(before.buffers)) << "rank " << r;
    own += schedule_bytes(s.ranks[r], &before);
  }
  // What they keep of their own is their slices' offsets: a small part of a whole rank.
  const std::size_t whole = schedule_bytes(s.ranks[0], nullptr);
  EXPECT_GT(own, 0u);
  EXPECT_LT(own, static_cast<std::size_t>(s.world_size - 2 * hpz) * whole / 4);
}

// Ranks the builder reads alike are derived from two built ones, not built
// (sim/deepspeed/derive.hpp): the schedule is the one building every rank gives, byte for byte,
// on worlds whose kinds start and end where slices turn to padding (small() at 128 ranks: the
// norm weights' 64 elements), with qwZ and qgZ, under each release's secondary-copy bounds, with
// hpZ off or over two nodes, and with one rank's secondaries missing ([bugs]).
TEST(Builder, DerivesRanksItReadsAlikeAsItWouldBuildThem) {
  struct Case {
    std::string what;
    Scenario sc;
  };
  std::vector<Case> cases;
  const auto add = [&](std::string what, int nodes, auto&& change) {
    Scenario sc = small();
    sc.cluster.nodes = nodes;
    change(sc);
    cases.push_back({std::move(what), sc});
  };
  add("128 ranks, padding", 32, [](Scenario&) {});
  add("qwZ and qgZ", 8, [](Scenario& sc) {
    // qwZ needs shards of a multiple of 8 elements: llama2-7b's norms (4,096) at 32 ranks.
    sc.model = model_preset("llama2-7b");
    sc.model.layers = 2;
    sc.zero.zero_quantized_weights = true;
    sc.zero.zero_quantized_gradients = true;
  });
  add("0.13.1", 6, [](Scenario& sc) { sc.zero.deepspeed_version = "0.13.1"; });
  add("0.14.4", 6, [](Scenario& sc) { sc.zero.deepspeed_version = "0.14.4"; });
  add("0.19.5", 6, [](Scenario& sc) { sc.zero.deepspeed_version = "0.19.5"; });
  add("event-wait, 2 steps", 6, [](Scenario& sc) {
    sc.run.variant = Variant::kEventWait;
    sc.run.steps = 2;
  });
  add("no hpZ", 6, [](Scenario& sc) { sc.zero.zero_hpz_partition_size = 1; });
  add("hpZ over two nodes", 8, [](Scenario& sc) { sc.zero.zero_hpz_partition_size = 8; });
  add("hpZ 2 in nodes of 4, qgZ", 6, [](Scenario& sc) {
    sc.zero.zero_hpz_partition_size = 2;
    sc.zero.zero_quantized_gradients = true;
  });
  add("mismatched rank 13", 6, [](Scenario& sc) { sc.bugs.secondary_mismatch_rank = 13; });
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string& version = c.sc.zero.deepspeed_version;
    const Schedule each = build_deepspeed_schedule(c.sc, version, {}, RankBuild::kEach);
    BuildProgress last;
    const Schedule derived =
        build_deepspeed_schedule(c.sc, version, [&](const BuildProgress& p) { last = p; });
    EXPECT_EQ(last.ranks_built, derived.world_size);
    // A kind's ranks but its first two and its last are derived: with 6 nodes, some (8 nodes for
    // qwZ, whose shards must hold a multiple of 8 elements, and for hpZ over two nodes).
    EXPECT_GT(last.derived, 0);
    const nlohmann::json a = schedule_to_json(derived), b = schedule_to_json(each);
    if (a == b) continue;
    ADD_FAILURE() << "the derived schedule differs from the one built rank by rank";
    for (std::size_t r = 0; r < a["ranks"].size() && r < b["ranks"].size(); ++r) {
      if (a["ranks"][r] != b["ranks"][r]) {
        ADD_FAILURE() << "first at rank " << r;
        break;
      }
    }
  }
  // Where DeepSpeed raises on some rank (0.14.4's narrow() past a norm weight's end at 128
  // ranks, hpZ positions 3 and up), so does the build that derives.
  Scenario raises = small();
  raises.cluster.nodes = 32;
  raises.zero.deepspeed_version = "0.14.4";
  std::string each_says, derived_says;
  try {
    build_deepspeed_schedule(raises, "0.14.4", {}, RankBuild::kEach);
  } catch (const InputError& e) {
    each_says = e.what();
  }
  try {
    build_deepspeed_schedule(raises, "0.14.4");
  } catch (const InputError& e) {
    derived_says = e.what();
  }
  EXPECT_NE(each_says.find("narrow()"), std::string::npos) << each_says;
  EXPECT_EQ(derived_says, each_says);
}

// Every shipped scenario at 8 nodes (its model cut to 4 layers, so that the sanitizer build runs
// both builds in seconds; the layers repeat one pattern): derived as built, byte for byte. A
// scenario the builder refuses (another builder's, or DeepSpeed would stop) refuses alike.
TEST(Builder, DerivesEveryShippedScenarioAsItWouldBuildIt) {
  int compared = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::source_dir() + "/scenarios")) {
    if (e.path().extension() != ".toml") continue;
    SCOPED_TRACE(e.path().filename().string());
    Scenario sc = load_scenario(e.path().string(), {{"cluster.nodes", "8"}});
    sc.model.layers = std::min(sc.model.layers, 4);
    if (sc.zero.stage != 3) continue;
    std::string each_says, derived_says;
    Schedule each, derived;
    BuildProgress last;
    try {
      each = build_deepspeed_schedule(sc, sc.zero.deepspeed_version, {}, RankBuild::kEach);
    } catch (const InputError& err) {
      each_says = err.what();
    }
    try {
      derived = build_deepspeed_schedule(sc, sc.zero.deepspeed_version,
                                         [&](const BuildProgress& p) { last = p; });
    } catch (const InputError& err) {
      derived_says = err.what();
    }
    EXPECT_EQ(derived_says, each_says);
    if (!each_says.empty()) continue;
    // Rank by rank as every reader (the JSON writer included) reads them; the JSON of whole
    // schedules is the first test's (here it was most of a minute).
    ASSERT_EQ(derived.ranks.size(), each.ranks.size());
    for (std::size_t r = 0; r < each.ranks.size(); ++r) {
      EXPECT_TRUE(deepspeed::same_rank_schedule(derived.ranks[r], each.ranks[r])) << "rank " << r;
    }
    compared += last.derived > 0 ? 1 : 0;
  }
  EXPECT_GE(compared, 8);
}

// The builder tells after each rank what the schedule holds (build_schedule's memory guard
// reads it), and a throw from there stops the build.
TEST(Builder, TellsWhatItHoldsAfterEachRankAndStopsOnAThrow) {
  const Scenario sc = small();
  std::vector<BuildProgress> seen;
  const Schedule s = build_deepspeed_schedule(sc, sc.zero.deepspeed_version,
                                              [&](const BuildProgress& p) { seen.push_back(p); });
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(s.world_size));
  std::size_t held = 0;
  for (Rank r = 0; r < s.world_size; ++r) {
    const Rank like = r == 0 ? -1 : (r >= s.hpz_size ? r - s.hpz_size : 0);
    held += schedule_bytes(s.ranks[r], like < 0 ? nullptr : &s.ranks[like]);
    EXPECT_EQ(seen[r].ranks_built, r + 1);
    EXPECT_EQ(seen[r].lead_ranks, s.hpz_size);
    EXPECT_EQ(seen[r].held, held) << "rank " << r;
  }
  EXPECT_EQ(seen.back().lead_bytes, seen[s.hpz_size - 1].held);
  EXPECT_GT(seen.back().held, seen.back().lead_bytes);
  int calls = 0;
  EXPECT_THROW(build_deepspeed_schedule(sc, sc.zero.deepspeed_version,
                                        [&](const BuildProgress& p) {
                                          ++calls;
                                          if (p.ranks_built == 3) throw std::runtime_error("stop");
                                        }),
               std::runtime_error);
  EXPECT_EQ(calls, 3);
}

// The guard measures the build as it goes (build_schedule): an InputError, never an exhausted
// machine, whatever the scenario's sizes made the floor before it let through.
TEST(Builder, TheMemoryGuardStopsWhatOutgrowsItsBudgetAndLetsTheRestThrough) {
  Scenario sc = small();
  sc.cluster.nodes = 1000;  // 4,000 ranks in hpZ groups of 4
  const auto message = [&](double memory, const BuildProgress& p) -> std::string {
    try {
      guard_build(sc, memory, p);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  constexpr double kMiB = 1024.0 * 1024;
  // 20 ranks built: the first group's 4 at 1 MiB, 16 after them at 100 KiB each (schedule_bytes).
  BuildProgress p;
  p.ranks_built = 20;
  p.lead_ranks = 4;
  p.lead_bytes = static_cast<std::size_t>(kMiB);
  p.held = p.lead_bytes + 16 * 100 * 1024;
  // 3,996 more such ranks: about 600 MiB resident. Refused early only far past the budget.
  EXPECT_NE(message(200 * kMiB, p).find("projected from the first 20 of its 4000 ranks"),
            std::string::npos)
      << message(200 * kMiB, p);
  EXPECT_EQ(message(400 * kMiB, p), "");
  EXPECT_EQ(message(0, p), "");  // no budget
  // One rank short of the probe: no projection yet, only what is held.
  BuildProgress early = p;
  early.ranks_built = 19;
  early.held -= 100 * 1024;
  EXPECT_EQ(message(200 * kMiB, early), "");
  EXPECT_NE(message(2 * kMiB, early).find("outgrew half of this machine's"), std::string::npos)
      << message(2 * kMiB, early);
  // The bytes held stop the build whatever the projection says: a first group of 4 MiB (6 MiB
  // resident) and ranks after it that keep nothing of their own project 10 MiB.
  BuildProgress big_lead = p;
  big_lead.lead_bytes = static_cast<std::size_t>(4 * kMiB);
  big_lead.held = big_lead.lead_bytes;
  EXPECT_EQ(message(6.5 * kMiB, big_lead), "");
  EXPECT_NE(message(5.5 * kMiB, big_lead)
                .find("outgrew half of this machine's 0.0107 GiB of "
                      "memory: about 0.00588 GiB after 20 of its 4000 "
                      "ranks"),
            std::string::npos)
      << message(5.5 * kMiB, big_lead);
  // The whole build with the guard on: the same schedule as without it.
  const Scenario small_world = small();
  EXPECT_EQ(schedule_to_json(build_schedule(small_world, 0)),
            schedule_to_json(build_schedule(small_world)));
}

// One node of 128 GPUs, hpZ over all of them: the ranks whose norm weights' secondary slices
// are padding (positions 64-127) issue other ops than rank 0 and have no node before them to
// share with, so each keeps a whole copy, far past the estimate from the sizes: a budget of
// 8 MiB lets the estimate through and the build stops with what it measured.
TEST(Builder, TheMemoryGuardStopsARealBuildWithWhatItMeasured) {
  Scenario sc = small();
  sc.cluster.nodes = 1;
  sc.cluster.gpus_per_node = 128;
  sc.zero.zero_hpz_partition_size = 128;
  try {
    (void)build_schedule(sc, 8.0 * 1024 * 1024);
    ADD_FAILURE() << "128 ranks that share nothing built in 8 MiB";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("outgrew half of this machine's"), std::string::npos) << what;
    EXPECT_NE(what.find("of its 128 ranks"), std::string::npos) << what;
  }
  EXPECT_EQ(build_schedule(sc, 1024.0 * 1024 * 1024).ranks.size(), 128u);
}

}  // namespace
}  // namespace hpz
