#pragma once
// `rankscope mcp`: a Model Context Protocol server over stdio, so that an
// SRE's assistant can answer "why is job 4242 slow?" from the live collector.
// JSON-RPC 2.0, one message per line (the MCP stdio transport); read-only
// tools over the same query API and client key as the CLI. The tools and
// what each returns: docs/operations.md, An assistant's interface (MCP).
#include <iosfwd>
#include <string>

#include "tools/cli/client.h"

namespace rankscope::cli {

struct McpArgs {
  std::string version;   // this server's version, as `initialize` reports it
  std::string endpoint;  // the collector it asks, named in errors
};

// Serves requests from `in` until it closes; replies go to `out`, nothing
// else does. Diagnostics go to `log` (stderr). Returns the exit status.
int run_mcp(QueryClient& client, const McpArgs& args, std::istream& in, std::ostream& out, std::ostream& log);

}  // namespace rankscope::cli
