#include "tools/cli/client.h"

#include "proto/codec.h"

namespace rankscope::cli {

QueryClient::QueryClient(std::string endpoint, int timeout_ms, curve::ClientKeys keys)
    : endpoint_(std::move(endpoint)), timeout_ms_(timeout_ms), keys_(std::move(keys)) {}

Result<void> QueryClient::ask(capnp::MallocMessageBuilder& request,
                              const std::function<void(proto::query::Reply::Reader)>& use) {
  zmq::socket_t socket(context_, zmq::socket_type::req);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::rcvtimeo, timeout_ms_);
  socket.set(zmq::sockopt::sndtimeo, timeout_ms_);
  curve::apply(socket, keys_);
  try {
    socket.connect(endpoint_);
    std::string bytes = proto::to_packed(request);
    if (!socket.send(zmq::buffer(bytes), zmq::send_flags::none))
      return make_error(Errc::io, "cannot send to the collector at " + endpoint_);
    zmq::message_t reply;
    if (!socket.recv(reply, zmq::recv_flags::none))
      return make_error(Errc::io, "no answer from the collector at " + endpoint_ + " within " +
                                      std::to_string(timeout_ms_) +
                                      (keys_.enabled()
                                           ? " ms: is rankscope-collector running there (--collector), is --collector-key "
                                             "its public key, and is this client's public key in its allow-list?"
                                           : " ms: is rankscope-collector running there (--collector), with --insecure? "
                                             "(a collector with CurveZMQ never answers a plaintext client)"));
    std::string error;
    auto read = proto::read_packed<proto::query::Reply>(
        std::string_view(static_cast<const char*>(reply.data()), reply.size()), proto::ReadLimits{},
        [&](proto::query::Reply::Reader r) {
          if (r.which() == proto::query::Reply::ERROR)
            error = r.getError();
          else
            use(r);
        });
    if (!read) return read.error();
    if (!error.empty()) return make_error(Errc::refused, error);
  } catch (const zmq::error_t& e) {
    return make_error(Errc::io, "collector at " + endpoint_ + ": " + e.what());
  }
  return {};
}

}  // namespace rankscope::cli
