#pragma once
// Feeds one agent message through the collector's real ingest path (Cap'n
// Proto bytes in, RocksDB commit out), as if `node`'s agent had sent it.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "collector/commit.h"
#include "collector/ingest/ingest.h"

namespace rankscope::testing {

// `bytes`: a packed message (proto/agent_wire.h builds them as the agent does).
inline void feed(collector::Ingest& ingest, collector::Commit& commit, const std::string& node,
                 const std::string& bytes, uint64_t now_ns = 0) {
  collector::Outbox out;
  ingest.on_agent_message("conn-" + node, bytes, out);
  EXPECT_TRUE(commit.run(now_ns));
}

inline void feed(collector::Ingest& ingest, collector::Commit& commit, const std::string& node,
                 const std::function<void(proto::wire::AgentMessage::Builder)>& fill, uint64_t now_ns = 0) {
  capnp::MallocMessageBuilder message;
  fill(message.initRoot<proto::wire::AgentMessage>());
  feed(ingest, commit, node, proto::to_packed(message), now_ns);
}

}  // namespace rankscope::testing
