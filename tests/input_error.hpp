// Tests of bad input: the one-line message of the InputError a call throws.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "sim/error.hpp"

/** `text` contains `part` (shown whole when it does not). */
#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

namespace hpz::test {

/** The message of the InputError that `body` throws; fails the test if it throws none. */
inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

}  // namespace hpz::test
