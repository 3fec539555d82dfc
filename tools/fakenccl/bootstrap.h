// How the ranks of a communicator find each other (ncclGetUniqueId and
// ncclCommInitRank): a rendezvous root hands out the ranks' addresses, then
// every pair of ranks opens one TCP connection (the mesh).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <vector>

#include "tools/fakenccl/net.h"
#include "tools/fakenccl/unique_id.h"

namespace rankscope::fakenccl {

// Starts, in this process, the rendezvous root of a new communicator (a thread
// listening on a TCP port) and writes its address and a fresh nonce to `id`.
// The root serves one communicator: once all its ranks have registered, it
// sends them the address table and exits.
ncclResult_t startRendezvousRoot(ncclUniqueId* id);

// A rank's connections to the other ranks: peers[r] for every r != rank.
struct MeshLinks {
  Endpoint self;          // where this rank listened (its split children listen there too)
  std::vector<Fd> peers;  // peers[rank] stays empty
};

// ncclCommInitRank's side: registers `rank` of `nranks` with the root that `id`
// names, waits for every rank to register, then connects the mesh. Blocks
// until all ranks have arrived, as NCCL does.
ncclResult_t joinThroughRoot(const UniqueIdFields& id, int rank, int nranks, MeshLinks* links);

// Connects `rank` to the other members of `table` (table[r] is where rank r
// listens; this rank listens on `listener`). Lower ranks are dialled and
// higher ones accepted, each new connection naming the communicator by
// `nonce`, so no pair waits on another.
ncclResult_t connectMesh(uint64_t nonce, int rank, const std::vector<Endpoint>& table, const Fd& listener,
                         std::vector<Fd>* peers);

}  // namespace rankscope::fakenccl
