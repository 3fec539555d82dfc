#pragma once
// What collector::run sets up around its writers: one commit into a real
// RocksDB store (collector/commit.h). Tests join the participants they use.
#include "collector/commit.h"

namespace rankscope::testing {

namespace detail {
struct StoreTargetHolder {
  explicit StoreTargetHolder(collector::TimelineStore& store) : target(store) {}
  collector::StoreTarget target;
};
}  // namespace detail

class StoreCommit : private detail::StoreTargetHolder, public collector::Commit {
 public:
  explicit StoreCommit(collector::TimelineStore& store) : StoreTargetHolder(store), Commit(target) {}
};

}  // namespace rankscope::testing
