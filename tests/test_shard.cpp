// Shard arithmetic against hand-computed cases.
#include <gtest/gtest.h>

#include "sim/ir/shard.hpp"

namespace hpz {
namespace {

TEST(ShardLayout, NumelNotDivisibleByWorldIsPadded) {
  const ShardLayout l(10, 4, 2);  // padded to 12: shards of 3, secondaries of 6
  EXPECT_EQ(l.padded_numel(), 12u);
  EXPECT_EQ(l.shard_numel(), 3u);
  EXPECT_EQ(l.secondary_numel(), 6u);
  EXPECT_EQ(l.primary_slice(3), (ElemRange{9, 12}));
  EXPECT_EQ(l.valid(l.primary_slice(3)), (ElemRange{9, 10}));
  EXPECT_EQ(l.secondary_slice(1), (ElemRange{6, 12}));
  EXPECT_EQ(l.valid(l.secondary_slice(1)), (ElemRange{6, 10}));
  EXPECT_EQ(l.valid(l.primary_slice(0)), (ElemRange{0, 3}));
}

TEST(ShardLayout, SecondarySliceEntirelyInPadding) {
  const ShardLayout l(5, 16, 8);  // padded 16, secondaries of 2: positions 3..7 are padding
  EXPECT_EQ(l.padded_numel(), 16u);
  EXPECT_EQ(l.secondary_numel(), 2u);
  EXPECT_EQ(l.valid(l.secondary_slice(2)), (ElemRange{4, 5}));
  EXPECT_TRUE(l.valid(l.secondary_slice(3)).empty());
  EXPECT_TRUE(l.valid(l.secondary_slice(7)).empty());
  EXPECT_EQ(l.valid(l.secondary_slice(7)).size(), 0u);
}

TEST(ShardLayout, LegacyCopyBoundsFollowThePrimaryShard) {
  const ShardLayout l(12, 16, 8);  // shards of 1 element: ranks 12..15 hold only padding
  EXPECT_TRUE(l.legacy_copy_happens(11));
  EXPECT_FALSE(l.legacy_copy_happens(12));
  // Rank 12 sits at position 4 of its hpZ group, whose secondary slice [8, 10) is real data.
  EXPECT_EQ(l.valid(l.secondary_slice(12 % 8)), (ElemRange{8, 10}));
}

TEST(ShardLayout, DivisibleNumelHasNoPadding) {
  const ShardLayout l(4096, 16, 8);
  EXPECT_EQ(l.padded_numel(), 4096u);
  EXPECT_EQ(l.valid(l.primary_slice(15)), (ElemRange{3840, 4096}));
}

}  // namespace
}  // namespace hpz
