// The CLI's pieces without a collector: its time arguments, and the MCP
// server's JSON-RPC layer (framing, version negotiation, errors). The tools
// against a live collector, through the official SDK: e2e.McpE2E.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tools/cli/mcp.h"
#include "tools/cli/usage_commands.h"

namespace rankscope::cli {
namespace {

using nlohmann::json;

constexpr uint64_t kNow = 1'795'000'000'000'000'000ull;

TEST(CliTime, ReadsWhatRankscopePrintsAndWhatPeopleType) {
  EXPECT_EQ(parse_time_ns("2026-11-25T00:50:20Z", kNow), 1'795'567'820'000'000'000ull);
  EXPECT_EQ(parse_time_ns("2026-11-25T00:50:20", kNow), 1'795'567'820'000'000'000ull);
  // format_time_ns's form: microseconds and a Z.
  EXPECT_EQ(parse_time_ns("2026-11-25T00:50:20.703757Z", kNow), 1'795'567'820'703'757'000ull);
  EXPECT_EQ(parse_time_ns("2026-11-25 00:50:20.5", kNow), 1'795'567'820'500'000'000ull);
  EXPECT_EQ(parse_time_ns("2026-11-25", kNow), 1'795'564'800'000'000'000ull);
  EXPECT_EQ(parse_time_ns("1795567820", kNow), 1'795'567'820'000'000'000ull);
  EXPECT_EQ(parse_time_ns("now", kNow), kNow);
  EXPECT_EQ(parse_time_ns("-2h", kNow), kNow - 7'200'000'000'000ull);
  EXPECT_EQ(parse_time_ns("-30m", kNow), kNow - 1'800'000'000'000ull);
}

TEST(CliTime, RefusesWhatIsNotATimeWithoutThrowing) {
  for (const char* bad : {"", "yesterday", "1.2.3", "-", "-h", "-5x", "-99999999999999999999d", "2026-13-45",
                          "2026-11-25T00:50:20.5.5Z", "2026-11-25T00:50:20ZZ", "99999999999999999999999"})
    EXPECT_FALSE(parse_time_ns(bad, kNow).has_value()) << bad;
}

// The server's replies to `lines`, one JSON value per line it wrote. Its
// collector is a port nothing listens on: tools answer with errors.
std::vector<json> serve(const std::vector<std::string>& lines, std::string* log = nullptr) {
  QueryClient client("tcp://127.0.0.1:1", 200);
  std::string input;
  for (const auto& l : lines) input += l + "\n";
  std::istringstream in(input);
  std::ostringstream out, err;
  EXPECT_EQ(run_mcp(client, {"9.9.9", "tcp://127.0.0.1:1"}, in, out, err), 0);
  if (log) *log = err.str();
  std::vector<json> replies;
  std::istringstream written(out.str());
  for (std::string line; std::getline(written, line);) {
    json reply = json::parse(line, nullptr, false);
    EXPECT_FALSE(reply.is_discarded()) << "a line that is not JSON: " << line;
    replies.push_back(reply);
  }
  return replies;
}

std::string request(int id, const std::string& method, const json& params = json::object()) {
  return json{{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}}.dump();
}

TEST(McpServer, NegotiatesTheProtocolVersion) {
  auto replies = serve({request(1, "initialize", {{"protocolVersion", "2025-06-18"}, {"capabilities", json::object()}}),
                        request(2, "initialize", {{"protocolVersion", "1999-01-01"}})});
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0]["result"]["protocolVersion"], "2025-06-18");
  EXPECT_EQ(replies[0]["result"]["serverInfo"]["name"], "rankscope");
  EXPECT_EQ(replies[0]["result"]["serverInfo"]["version"], "9.9.9");
  EXPECT_TRUE(replies[0]["result"]["capabilities"].contains("tools"));
  // One it does not know: its newest, for the client to decide.
  EXPECT_EQ(replies[1]["result"]["protocolVersion"], "2025-11-25");
}

TEST(McpServer, ListsReadOnlyToolsWithSchemas) {
  auto replies = serve({request(1, "tools/list")});
  ASSERT_EQ(replies.size(), 1u);
  std::set<std::string> names;
  for (const auto& tool : replies[0]["result"]["tools"]) {
    names.insert(tool["name"].get<std::string>());
    EXPECT_EQ(tool["inputSchema"]["type"], "object") << tool.dump();
    EXPECT_EQ(tool["annotations"]["readOnlyHint"], true) << tool.dump();
    EXPECT_FALSE(tool["description"].get<std::string>().empty());
  }
  EXPECT_EQ(names, (std::set<std::string>{"explain_finding", "job_report", "list_findings", "list_jobs", "node_status",
                                          "rank_timeline"}));
}

TEST(McpServer, AnswersBadMessagesWithJsonRpcErrorsAndGoesOn) {
  auto replies = serve({"not json", "[]", "42", R"({"jsonrpc":"2.0","id":{"a":1},"method":"ping"})",
                        R"({"jsonrpc":"1.0","id":3,"method":"ping"})", request(4, "resources/list"),
                        request(5, "tools/call", {{"name", "no_such_tool"}}), request(6, "tools/call"),
                        R"({"jsonrpc":"2.0","method":"notifications/initialized"})", request(7, "ping")});
  ASSERT_EQ(replies.size(), 9u);  // the notification has no reply
  EXPECT_EQ(replies[0]["error"]["code"], -32700);
  EXPECT_EQ(replies[1]["error"]["code"], -32600);
  EXPECT_EQ(replies[2]["error"]["code"], -32600);
  EXPECT_EQ(replies[3]["error"]["code"], -32600);
  EXPECT_EQ(replies[4]["error"]["code"], -32600);
  EXPECT_EQ(replies[4]["id"], 3);
  EXPECT_EQ(replies[5]["error"]["code"], -32601);
  EXPECT_EQ(replies[6]["error"]["code"], -32602);
  EXPECT_EQ(replies[7]["error"]["code"], -32602);
  EXPECT_EQ(replies[8]["id"], 7);
  EXPECT_EQ(replies[8]["result"], json::object());
}

TEST(McpServer, AnswersABatchInOneLine) {
  auto replies = serve({"[" + request(1, "ping") + "," + R"({"jsonrpc":"2.0","method":"notifications/x"})" + "," +
                        request(2, "ping") + "]"});
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].is_array());
  ASSERT_EQ(replies[0].size(), 2u);
  EXPECT_EQ(replies[0][0]["id"], 1);
  EXPECT_EQ(replies[0][1]["id"], 2);
}

TEST(McpServer, BadArgumentsAndADeadCollectorAreToolErrorsThatSayWhy) {
  auto replies = serve({request(1, "tools/call", {{"name", "explain_finding"}, {"arguments", {{"id", "seven"}}}}),
                        request(2, "tools/call", {{"name", "explain_finding"}, {"arguments", json::object()}}),
                        request(3, "tools/call", {{"name", "rank_timeline"}, {"arguments", {{"comm", "ab"}, {"rank", 0}, {"around", "soon"}}}}),
                        request(4, "tools/call", {{"name", "list_findings"}, {"arguments", {{"limit", 0}}}}),
                        request(5, "tools/call", {{"name", "node_status"}, {"arguments", json::array()}}),
                        request(6, "tools/call", {{"name", "list_findings"}})});
  ASSERT_EQ(replies.size(), 6u);
  auto text = [](const json& reply) { return reply["result"]["content"][0]["text"].get<std::string>(); };
  for (const auto& reply : replies) EXPECT_EQ(reply["result"]["isError"], true) << reply.dump();
  EXPECT_NE(text(replies[0]).find("'id' must be an integer"), std::string::npos) << text(replies[0]);
  EXPECT_NE(text(replies[1]).find("'id' is required"), std::string::npos) << text(replies[1]);
  EXPECT_NE(text(replies[2]).find("'around' is not a time"), std::string::npos) << text(replies[2]);
  EXPECT_NE(text(replies[3]).find("'limit' must be from 1 to 500"), std::string::npos) << text(replies[3]);
  EXPECT_NE(text(replies[4]).find("'arguments' must be an object"), std::string::npos) << text(replies[4]);
  EXPECT_NE(text(replies[5]).find("the collector did not answer"), std::string::npos) << text(replies[5]);
}

}  // namespace
}  // namespace rankscope::cli
