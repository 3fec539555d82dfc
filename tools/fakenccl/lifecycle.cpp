#include "tools/fakenccl/lifecycle.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "proto/records.h"
#include "tools/fakenccl/bootstrap.h"
#include "tools/fakenccl/error.h"
#include "tools/fakenccl/unique_id.h"

namespace rankscope::fakenccl {
namespace {

ncclResult_t makeCommunicator(int rank, int nranks, int device, uint64_t nonce, uint64_t hash, MeshLinks links,
                              ncclComm_t* comm) {
  std::unique_ptr<Mesh> mesh;
  FAKENCCL_TRY(Mesh::create(std::move(links.peers), &mesh));
  *comm = registerCommunicator(
      std::make_shared<Communicator>(rank, nranks, device, nonce, hash, links.self, std::move(mesh)));
  return ncclSuccess;
}

// splitmix64's finaliser: spreads the split's identity over the nonce.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// What each rank tells the others in ncclCommSplit.
struct SplitEntry {
  int32_t color;
  int32_t key;
  Endpoint listening;  // where it accepts its new peers
};
static_assert(sizeof(SplitEntry) == 16);

}  // namespace

ncclResult_t initRank(const char* api, ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank, int device) {
  UniqueIdFields fields;
  if (!decodeUniqueId(id, &fields)) {
    return fail(ncclInvalidArgument, "%s: the unique id was not made by fakenccl's ncclGetUniqueId", api);
  }
  MeshLinks links;
  FAKENCCL_TRY(joinThroughRoot(fields, rank, nranks, &links));
  // NCCL's commHash: a hash of the unique id's bytes.
  const uint64_t hash =
      proto::comm_hash_of_unique_id(reinterpret_cast<const uint8_t*>(id.internal), sizeof(id.internal));
  return makeCommunicator(rank, nranks, device, fields.nonce, hash, std::move(links), comm);
}

ncclResult_t initAll(ncclComm_t* comms, int ndev, const int* devices) {
  ncclUniqueId id;
  FAKENCCL_TRY(startRendezvousRoot(&id));
  std::vector<ncclResult_t> results(ndev, ncclSuccess);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ndev; ++rank) {
    comms[rank] = nullptr;
    const int device = devices != nullptr ? devices[rank] : rank;
    threads.emplace_back(
        [&, rank, device] { results[rank] = initRank("ncclCommInitAll", &comms[rank], ndev, id, rank, device); });
  }
  for (std::thread& thread : threads) thread.join();
  auto failed = std::find_if(results.begin(), results.end(), [](ncclResult_t r) { return r != ncclSuccess; });
  if (failed == results.end()) return ncclSuccess;
  for (int rank = 0; rank < ndev; ++rank) {
    if (auto communicator = unregisterCommunicator(comms[rank])) communicator->abort();
    comms[rank] = nullptr;
  }
  return *failed;
}

ncclResult_t splitCommunicator(const std::shared_ptr<Communicator>& parent, int color, int key, ncclComm_t* child) {
  *child = nullptr;
  const uint64_t splitIndex = parent->takeSplitIndex();
  SplitEntry mine{color, key, {}};
  Fd listener;
  if (color != NCCL_SPLIT_NOCOLOR) {
    FAKENCCL_TRY(listenOn(parent->self().ip, &listener, &mine.listening));
  }
  std::vector<SplitEntry> entries(parent->nranks());
  FAKENCCL_TRY(parent->allGatherOnHost(&mine, entries.data(), sizeof(SplitEntry)));
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;

  std::vector<int> members;  // parent ranks, in the child's rank order
  for (int r = 0; r < parent->nranks(); ++r) {
    if (entries[r].color == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return entries[a].key < entries[b].key; });
  const int childRank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank()) - members.begin());
  std::vector<Endpoint> table;
  table.reserve(members.size());
  for (int r : members) table.push_back(entries[r].listening);

  const uint64_t nonce = mix(parent->nonce() ^ mix(splitIndex ^ mix(static_cast<uint32_t>(color))));
  MeshLinks links{mine.listening, {}};
  FAKENCCL_TRY(connectMesh(nonce, childRank, table, listener, &links.peers));
  // NCCL's commHash of a split child: of the parent's, its count of splits (this one included) and the color.
  const uint64_t hash = proto::comm_hash_of_split(parent->hash(), static_cast<int32_t>(splitIndex + 1), color);
  return makeCommunicator(childRank, static_cast<int>(members.size()), parent->device(), nonce, hash, std::move(links),
                          child);
}

}  // namespace rankscope::fakenccl
