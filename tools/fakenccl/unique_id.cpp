#include "tools/fakenccl/unique_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "tools/fakenccl/error.h"

namespace rankscope::fakenccl {
namespace {

constexpr char kMagic[8] = {'f', 'k', 'n', 'c', 'c', 'l', '0', '1'};

// The leading bytes of ncclUniqueId::internal.
struct UniqueIdLayout {
  char magic[8];
  Endpoint root;
  uint64_t nonce;
};
static_assert(sizeof(UniqueIdLayout) <= NCCL_UNIQUE_ID_BYTES);

}  // namespace

ncclResult_t fillRandom(void* data, size_t bytes) {
  char* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t got = getrandom(cursor, bytes, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fail(ncclSystemError, "getrandom: %s", std::strerror(errno));
    cursor += got;
    bytes -= static_cast<size_t>(got);
  }
  return ncclSuccess;
}

ncclResult_t encodeUniqueId(const UniqueIdFields& fields, ncclUniqueId* id) {
  FAKENCCL_TRY(fillRandom(id->internal, sizeof(id->internal)));
  UniqueIdLayout layout{};
  std::memcpy(layout.magic, kMagic, sizeof(kMagic));
  layout.root = fields.root;
  layout.nonce = fields.nonce;
  std::memcpy(id->internal, &layout, sizeof(layout));
  return ncclSuccess;
}

bool decodeUniqueId(const ncclUniqueId& id, UniqueIdFields* fields) {
  UniqueIdLayout layout;
  std::memcpy(&layout, id.internal, sizeof(layout));
  if (std::memcmp(layout.magic, kMagic, sizeof(kMagic)) != 0) return false;
  fields->root = layout.root;
  fields->nonce = layout.nonce;
  return true;
}

}  // namespace rankscope::fakenccl
