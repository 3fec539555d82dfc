#pragma once
// Ring-buffer records -> typed events, through one bounds-checked function.
#include <cstddef>
#include <optional>
#include <variant>

#include "bpf/nccl_events.h"

namespace rankscope::agent {

using Event = std::variant<rs_call_event, rs_comm_init_event, rs_comm_end_event, rs_wait_event, rs_exit_event,
                           rs_setenv_event, rs_set_device_event, rs_async_error_event>;

// Checks the kind and the exact size for it, then copies the bytes out.
// nullopt for anything malformed (the caller counts it).
std::optional<Event> decode_event(const void* data, size_t size);

}  // namespace rankscope::agent
