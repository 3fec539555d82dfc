// The drop-counter table (common/drops.h) against the wire schema, its
// binding (proto/drops.h), the metric and docs/metrics.md.
#include "common/drops.h"

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "collector/metrics.h"
#include "proto/drops.h"
#include "tests/support/harness.h"

namespace rankscope {
namespace {

namespace wire = proto::wire;

std::string snake_case(std::string_view camel) {
  std::string out;
  for (char c : camel) {
    if (std::isupper(static_cast<unsigned char>(c))) {
      out += '_';
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else {
      out += c;
    }
  }
  return out;
}

TEST(Drops, TheTableHasOneRowPerWireFieldInItsOrder) {
  auto fields = capnp::Schema::from<wire::DropCounters>().getFields();
  ASSERT_EQ(fields.size(), kDropReasons.size()) << "a field of wire::DropCounters without its row, or the reverse";
  for (unsigned i = 0; i < fields.size(); ++i)
    EXPECT_EQ(snake_case(fields[i].getProto().getName().cStr()), kDropReasons[i].name) << "field " << i;
}

// Each row is bound to the field of its own name: a count written alone
// arrives in that field and nowhere else.
TEST(Drops, EachCountTravelsInItsOwnField) {
  for (const DropReason& reason : kDropReasons) {
    DropCounts one;
    one.*reason.count = 1234;
    capnp::MallocMessageBuilder message;
    auto built = message.initRoot<wire::DropCounters>();
    proto::write_drops(one, built);
    auto dynamic = capnp::toDynamic(built.asReader());
    for (auto field : capnp::Schema::from<wire::DropCounters>().getFields()) {
      uint64_t expected = snake_case(field.getProto().getName().cStr()) == reason.name ? 1234 : 0;
      EXPECT_EQ(dynamic.get(field).as<uint64_t>(), expected)
          << reason.name << " in " << field.getProto().getName().cStr();
    }
    EXPECT_EQ(proto::read_drops(built.asReader()), one) << reason.name;
  }
}

TEST(Drops, LargerCountsWinAndOnlyLossesAreSummed) {
  DropCounts known, seen;
  known.ringbuf_full = 5;
  seen.ringbuf_full = 3;
  seen.unknown_comm = 7;
  seen.malformed = 2;
  keep_larger(known, seen);
  EXPECT_EQ(known.ringbuf_full, 5u);
  EXPECT_EQ(known.unknown_comm, 7u);
  EXPECT_EQ(known.malformed, 2u);
  EXPECT_EQ(records_lost(known), 7u);  // ringbuf_full and malformed; unmatched calls are recorded
}

// Every reason is named in the metric's help and described in the docs'
// label list, with nothing else claimed there.
TEST(Drops, TheMetricAndTheDocsNameEveryReason) {
  std::string help;
  for (const auto& metric : collector::metric_catalogue())
    if (std::string(metric.name) == "rankscope_agent_drops_total") help = metric.help;
  ASSERT_FALSE(help.empty());
  std::string docs = testing::slurp(std::string(RANKSCOPE_SOURCE_DIR) + "/docs/metrics.md");
  ASSERT_FALSE(docs.empty()) << "docs/metrics.md not found under " << RANKSCOPE_SOURCE_DIR;
  size_t reasons = docs.find("- `reason`:");
  ASSERT_NE(reasons, std::string::npos) << "docs/metrics.md has no `reason` label entry";
  std::string entry = docs.substr(reasons, docs.find("\n- `", reasons + 1) - reasons);
  for (const DropReason& reason : kDropReasons) {
    EXPECT_NE(help.find(std::string(reason.name)), std::string::npos) << reason.name << " not in: " << help;
    EXPECT_NE(entry.find("`" + std::string(reason.name) + "`"), std::string::npos)
        << reason.name << " not in docs/metrics.md's reason entry:\n"
        << entry;
  }
}

}  // namespace
}  // namespace rankscope
