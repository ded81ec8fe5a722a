// Golden orders: the canonical text of an issue order, its digest, the golden file and its diff.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "sim/builder.hpp"
#include "sim/error.hpp"
#include "sim/ir/order.hpp"
#include "tests/paths.hpp"

namespace hpz {
namespace {

Schedule built(const std::string& scenario, const std::vector<Override>& overrides = {}) {
  Scenario sc = load_scenario(test::scenario_path(scenario), overrides);
  return build_schedule(sc);
}

std::size_t changed_lines(const std::vector<LineEdit>& edits) {
  return static_cast<std::size_t>(std::count_if(edits.begin(), edits.end(), [](const LineEdit& e) {
    return e.a == static_cast<std::size_t>(-1) || e.b == static_cast<std::size_t>(-1);
  }));
}

TEST(CanonicalOrder, IsTheSameForTheSameScenario) {
  const Schedule a = built("tiny");
  const Schedule b = built("tiny");
  for (Rank r = 0; r < a.world_size; ++r) {
    EXPECT_EQ(canonical_order(a, r), canonical_order(b, r));
  }
  EXPECT_EQ(order_digest(canonical_order(a, 0)), order_digest(canonical_order(b, 0)));
}

TEST(CanonicalOrder, AnUnrelatedOpAddedChangesOneLine) {
  // A host sync added in the middle of rank 0's order, as a builder change would: no other line
  // may change (no op indexes, no event ids in the lines).
  const Schedule before = built("tiny", {{"run.builder", "deepspeed"}});
  Schedule after = before;
  RankSchedule& rs = after.ranks[0];
  const std::size_t middle = rs.ops.size() / 2;
  Op sync;
  sync.kind = OpKind::kHostStreamSync;
  sync.stream = 0;
  sync.step = rs.ops[middle].step;
  sync.phase = rs.ops[middle].phase;
  rs.ops.mut().insert(rs.ops.mut().begin() + static_cast<std::ptrdiff_t>(middle), sync);
  // An extra event record on the same stream, before every other record, for another module:
  // events are named by stream and label, so the later records keep their names.
  Op record = rs.ops[0];
  after.labels.push_back("an unrelated module");
  record.label = static_cast<LabelId>(after.labels.size() - 1);
  record.kind = OpKind::kEventRecord;
  record.event = 1'000'000;
  record.access_count = 0;
  record.buffer = kNoBuffer;
  rs.ops.mut().insert(rs.ops.mut().begin(), record);

  const std::vector<std::string> a = canonical_order(before, 0);
  const std::vector<std::string> b = canonical_order(after, 0);
  bool too_far = true;
  const std::vector<LineEdit> edits = line_diff(a, b, 100, too_far);
  ASSERT_FALSE(too_far);
  EXPECT_EQ(changed_lines(edits), 2u);
  EXPECT_NE(order_digest(a), order_digest(b));
  for (Rank r = 1; r < before.world_size; ++r)
    EXPECT_EQ(canonical_order(before, r), canonical_order(after, r));
}

TEST(CanonicalOrder, NamesEventsByStreamAndLabel) {
  const std::vector<std::string> lines = canonical_order(built("tiny"), 0);
  const auto wait = std::find_if(lines.begin(), lines.end(), [](const std::string& l) {
    return l.find("stream_wait_event") != std::string::npos;
  });
  ASSERT_NE(wait, lines.end());
  EXPECT_NE(wait->find(" | for S"), std::string::npos) << *wait;
  EXPECT_NE(wait->find("#"), std::string::npos) << *wait;
}

TEST(CanonicalOrder, EveryVariantHasItsOwnOrder) {
  // The golden files tell the fixes from stock: a change that dropped a fix would show.
  const Schedule stock = built("tiny");
  for (const char* variant : {"host-sync", "event-wait"}) {
    const Schedule fixed = built("tiny", {{"run.variant", variant}});
    EXPECT_NE(order_digest(canonical_order(stock, 0)), order_digest(canonical_order(fixed, 0)))
        << variant;
  }
}

TEST(LineDiff, FindsTheShortestScript) {
  const std::vector<std::string> a = {"a", "b", "c", "d", "e"};
  const std::vector<std::string> b = {"a", "c", "d", "x", "e", "f"};
  bool too_far = true;
  const std::vector<LineEdit> edits = line_diff(a, b, 100, too_far);
  ASSERT_FALSE(too_far);
  EXPECT_EQ(changed_lines(edits), 3u);  // - b, + x, + f
  // Replaying the script on a gives b.
  std::vector<std::string> rebuilt;
  std::size_t next_a = 0;
  for (const LineEdit& e : edits) {
    if (e.a != static_cast<std::size_t>(-1)) {
      EXPECT_EQ(e.a, next_a++);
    }
    if (e.b != static_cast<std::size_t>(-1)) rebuilt.push_back(b[e.b]);
  }
  EXPECT_EQ(rebuilt, b);
  EXPECT_EQ(next_a, a.size());
}

TEST(LineDiff, GivesUpBeyondItsBudget) {
  std::vector<std::string> a;
  std::vector<std::string> b;
  for (int i = 0; i < 50; ++i) {
    a.push_back(fmt::format("a{}", i));
    b.push_back(fmt::format("b{}", i));
  }
  bool too_far = false;
  EXPECT_TRUE(line_diff(a, b, 10, too_far).empty());
  EXPECT_TRUE(too_far);
  EXPECT_EQ(changed_lines(line_diff(a, b, 100, too_far)), 100u);
  EXPECT_FALSE(too_far);
  EXPECT_EQ(line_diff(a, a, 0, too_far).size(), a.size());
  EXPECT_FALSE(too_far);
}

TEST(GoldenOrder, RoundTripsThroughItsText) {
  const Schedule s = built("tiny");
  const GoldenOrder g = make_golden_order(s, "scenarios/tiny.toml", {"run.variant=stock"}, "x");
  ASSERT_FALSE(g.order.empty());
  const GoldenOrder back = parse_golden_order(golden_order_text(g), "f.order");
  EXPECT_EQ(back.scenario, g.scenario);
  EXPECT_EQ(back.sets, g.sets);
  EXPECT_EQ(back.order, g.order);
  EXPECT_EQ(golden_order_diff(g, back), "");
  // A long order is stored as sections, and those round-trip too.
  const GoldenOrder sections = make_golden_order(s, "scenarios/tiny.toml", {}, "x", 10);
  EXPECT_TRUE(sections.order.empty());
  EXPECT_GT(sections.sections.size(), 10u);
  EXPECT_EQ(golden_order_diff(sections, parse_golden_order(golden_order_text(sections), "f")), "");
}

TEST(GoldenOrder, DiffNamesTheRanksAndTheLines) {
  const GoldenOrder stock = make_golden_order(built("tiny"), "s", {}, "x");
  const GoldenOrder fixed =
      make_golden_order(built("tiny", {{"run.variant", "host-sync"}}), "s", {}, "x");
  const std::string diff = golden_order_diff(stock, fixed);
  EXPECT_NE(diff.find("ranks whose order differs: 0-3"), std::string::npos) << diff;
  EXPECT_NE(diff.find("+ "), std::string::npos) << diff;
  EXPECT_NE(diff.find("host_stream_sync fix_host_sync"), std::string::npos) << diff;
  // With sections, the differing sections are named.
  const GoldenOrder stock_s = make_golden_order(built("tiny"), "s", {}, "x", 10);
  const GoldenOrder fixed_s =
      make_golden_order(built("tiny", {{"run.variant", "host-sync"}}), "s", {}, "x", 10);
  const std::string sections = golden_order_diff(stock_s, fixed_s);
  EXPECT_NE(sections.find("first differing sections"), std::string::npos) << sections;
  EXPECT_NE(sections.find("@@ golden section"), std::string::npos) << sections;
}

TEST(GoldenOrder, BadTextIsRefusedWithItsLine) {
  auto message = [](const std::string& text) {
    try {
      parse_golden_order(text, "g.order");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string head = "# hpzlab golden order, format 1\nscenario s.toml\n";
  EXPECT_EQ(message("scenario s.toml\n"),
            "g.order: line 1: not an hpzlab golden order (it starts with '# hpzlab golden order, "
            "format 1')");
  EXPECT_EQ(message(head + "rank 0 ops 1 digest 0123456789abcdef\norder of rank 0\n"),
            "g.order: line 4: rank 0 has 1 ops, but 0 order lines follow");
  EXPECT_EQ(message(head + "rank 1 ops 1 digest 0123456789abcdef\n"),
            "g.order: line 3: expected 'rank 0 ops N digest HEX16'");
  EXPECT_NE(message(head + "bogus\n").find("line 3: 'bogus' is not a golden order line"),
            std::string::npos);
  EXPECT_EQ(message(head + "rank 0 ops 0 digest 0123456789abcdef\n"),
            "g.order: line 3: no 'order of rank 0' or 'sections of rank 0' line");
}

}  // namespace
}  // namespace hpz
