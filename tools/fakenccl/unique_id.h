// What fakenccl puts inside the 128 opaque bytes of an ncclUniqueId.
#pragma once

#include <nccl.h>

#include <cstdint>

#include "tools/fakenccl/net.h"

namespace rankscope::fakenccl {

struct UniqueIdFields {
  Endpoint root;   // the rendezvous root that ncclGetUniqueId started
  uint64_t nonce;  // names the communicator; random
};

// Writes `fields` behind a magic; every other byte is random, so that no two
// ids are alike (tracers tell communicators apart by hashing all 128 bytes).
ncclResult_t encodeUniqueId(const UniqueIdFields& fields, ncclUniqueId* id);

// False when `id` was not made by encodeUniqueId.
bool decodeUniqueId(const ncclUniqueId& id, UniqueIdFields* fields);

// Random bytes from the kernel.
ncclResult_t fillRandom(void* data, size_t bytes);

}  // namespace rankscope::fakenccl
