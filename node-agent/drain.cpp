#include "node-agent/drain.h"

#include <cstring>

namespace rankscope::agent {

namespace {
template <typename T>
std::optional<Event> copy_as(const void* data, size_t size) {
  if (size < sizeof(T)) return std::nullopt;
  T event;
  std::memcpy(&event, data, sizeof(T));
  return Event{event};
}
}  // namespace

std::optional<Event> decode_event(const void* data, size_t size) {
  if (!data || size < sizeof(rs_event_header)) return std::nullopt;
  rs_event_header header;
  std::memcpy(&header, data, sizeof(header));
  switch (header.kind) {
    case RS_EV_CALL: return copy_as<rs_call_event>(data, size);
    case RS_EV_COMM_INIT: return copy_as<rs_comm_init_event>(data, size);
    case RS_EV_COMM_END: return copy_as<rs_comm_end_event>(data, size);
    case RS_EV_WAIT: return copy_as<rs_wait_event>(data, size);
    case RS_EV_EXIT: return copy_as<rs_exit_event>(data, size);
    case RS_EV_SETENV: return copy_as<rs_setenv_event>(data, size);
    case RS_EV_SET_DEVICE: return copy_as<rs_set_device_event>(data, size);
    case RS_EV_ASYNC_ERROR: return copy_as<rs_async_error_event>(data, size);
    default: return std::nullopt;
  }
}

}  // namespace rankscope::agent
