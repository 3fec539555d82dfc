#pragma once
// A query client for the collector (used by the CLI and by tests).
#include <capnp/message.h>

#include <functional>
#include <string>
#include <zmq.hpp>

#include "common/curve.h"
#include "common/result.h"
#include "proto/query.capnp.h"

namespace rankscope::cli {

class QueryClient {
 public:
  // `keys` empty: plaintext (a collector run with --insecure).
  QueryClient(std::string endpoint, int timeout_ms, curve::ClientKeys keys = {});

  // Sends `request` and calls `use` with the reply, inside the reader's
  // guard. A collector error reply becomes an Error.
  Result<void> ask(capnp::MallocMessageBuilder& request,
                   const std::function<void(proto::query::Reply::Reader)>& use);

 private:
  std::string endpoint_;
  int timeout_ms_;
  curve::ClientKeys keys_;
  zmq::context_t context_{1};
};

}  // namespace rankscope::cli
