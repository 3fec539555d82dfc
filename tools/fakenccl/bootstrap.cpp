#include "tools/fakenccl/bootstrap.h"

#include <string>
#include <thread>

#include "tools/fakenccl/error.h"

namespace rankscope::fakenccl {
namespace {

constexpr uint32_t kRegisterMagic = 0x666b7231;   // "fkr1"
constexpr uint32_t kHandshakeMagic = 0x666b6831;  // "fkh1"

// Rank -> root.
struct RegisterRequest {
  uint32_t magic;
  int32_t rank;
  int32_t nranks;
  uint32_t reserved;
  uint64_t nonce;
  Endpoint listening;  // where this rank accepts its peers
};
static_assert(sizeof(RegisterRequest) == 32);

enum RegisterStatus : int32_t {
  kRegistered = 0,
  kWrongCommunicator = 1,  // the nonce is not this root's: a stale or foreign id
  kNranksMismatch = 2,     // another rank registered with a different nranks
  kRankTaken = 3,          // another process registered the same rank
  kRankOutOfRange = 4,
};

// Root -> rank; when status is kRegistered, nranks Endpoints follow.
struct RegisterReply {
  int32_t status;
  int32_t nranks;  // the communicator's size, as the first rank registered it
};

// Dialling rank -> accepting rank, first bytes of every mesh connection.
struct Handshake {
  uint32_t magic;
  int32_t rank;
  uint64_t nonce;
};

RegisterStatus validate(const RegisterRequest& request, uint64_t nonce, int nranks, const std::vector<Fd>& members) {
  if (request.magic != kRegisterMagic || request.nonce != nonce) return kWrongCommunicator;
  if (request.nranks < 1 || request.rank < 0 || request.rank >= request.nranks) {
    return kRankOutOfRange;
  }
  if (nranks != 0 && request.nranks != nranks) return kNranksMismatch;
  if (nranks != 0 && members[request.rank].valid()) return kRankTaken;
  return kRegistered;
}

// The root's thread: collects registrations until every rank is in, then
// sends each one the table. A refused registration gets its reason and does
// not count; the root keeps waiting for the real rank.
void serveRendezvous(Fd listener, uint64_t nonce) {
  int nranks = 0;  // fixed by the first accepted registration
  int registered = 0;
  std::vector<Fd> members;
  std::vector<Endpoint> table;
  while (nranks == 0 || registered < nranks) {
    Fd connection;
    RegisterRequest request;
    if (acceptFrom(listener, &connection) != ncclSuccess) return;
    if (recvAll(connection, &request, sizeof(request)) != ncclSuccess) continue;
    RegisterStatus status = validate(request, nonce, nranks, members);
    if (status != kRegistered) {
      RegisterReply refusal{status, nranks};
      (void)sendAll(connection, &refusal, sizeof(refusal));
      continue;
    }
    if (nranks == 0) {
      nranks = request.nranks;
      members.resize(nranks);
      table.resize(nranks);
    }
    members[request.rank] = std::move(connection);
    table[request.rank] = request.listening;
    ++registered;
  }
  RegisterReply accepted{kRegistered, nranks};
  for (const Fd& member : members) {
    // A rank that died meanwhile finds out nothing; the others proceed and
    // will see its connection fail.
    if (sendAll(member, &accepted, sizeof(accepted)) == ncclSuccess) {
      (void)sendAll(member, table.data(), table.size() * sizeof(Endpoint));
    }
  }
}

ncclResult_t refusalError(const RegisterReply& reply, int rank, int nranks, const Endpoint& root) {
  switch (reply.status) {
    case kNranksMismatch:
      return fail(ncclInvalidArgument,
                  "ncclCommInitRank: rank %d was given nranks=%d, but the communicator of root %s "
                  "was started by ranks with nranks=%d",
                  rank, nranks, toString(root).c_str(), reply.nranks);
    case kRankTaken:
      return fail(ncclInvalidArgument,
                  "ncclCommInitRank: rank %d of the communicator of root %s was already taken by "
                  "another caller (duplicate rank)",
                  rank, toString(root).c_str());
    case kRankOutOfRange:
      return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d is not in [0, %d)", rank, nranks);
    case kWrongCommunicator:
      return fail(ncclInvalidArgument,
                  "ncclCommInitRank: the root at %s serves another communicator "
                  "(a unique id left over from an earlier run?)",
                  toString(root).c_str());
    default:
      return fail(ncclInternalError, "ncclCommInitRank: root %s answered with unknown status %d",
                  toString(root).c_str(), reply.status);
  }
}

}  // namespace

ncclResult_t startRendezvousRoot(ncclUniqueId* id) {
  uint32_t ip;
  FAKENCCL_TRY(chooseInterfaceAddress(&ip));
  UniqueIdFields fields{};
  Fd listener;
  FAKENCCL_TRY(listenOn(ip, &listener, &fields.root));
  FAKENCCL_TRY(fillRandom(&fields.nonce, sizeof(fields.nonce)));
  FAKENCCL_TRY(encodeUniqueId(fields, id));
  // Detached: like NCCL's bootstrap root, it lives until its ranks arrive.
  std::thread(serveRendezvous, std::move(listener), fields.nonce).detach();
  return ncclSuccess;
}

ncclResult_t joinThroughRoot(const UniqueIdFields& id, int rank, int nranks, MeshLinks* links) {
  Fd root;
  FAKENCCL_TRY(connectTo(id.root, "the rendezvous root", &root,
                         " (a root serves until its communicator has formed, and only while its "
                         "process lives: is the unique id from an earlier run?)"));
  // Listen where the root is reachable from (the route's source address),
  // unless NCCL_SOCKET_IFNAME names the interface.
  Endpoint towardsRoot;
  FAKENCCL_TRY(localEndpoint(root, &towardsRoot));
  uint32_t ip = towardsRoot.ip;
  if (socketInterfaceChosen()) FAKENCCL_TRY(chooseInterfaceAddress(&ip));
  Fd listener;
  FAKENCCL_TRY(listenOn(ip, &listener, &links->self));

  RegisterRequest request{kRegisterMagic, rank, nranks, 0, id.nonce, links->self};
  FAKENCCL_TRY(sendAll(root, &request, sizeof(request)));
  RegisterReply reply;
  FAKENCCL_TRY(recvAll(root, &reply, sizeof(reply)));
  if (reply.status != kRegistered) return refusalError(reply, rank, nranks, id.root);
  std::vector<Endpoint> table(nranks);
  FAKENCCL_TRY(recvAll(root, table.data(), table.size() * sizeof(Endpoint)));
  return connectMesh(id.nonce, rank, table, listener, &links->peers);
}

ncclResult_t connectMesh(uint64_t nonce, int rank, const std::vector<Endpoint>& table, const Fd& listener,
                         std::vector<Fd>* peers) {
  const int nranks = static_cast<int>(table.size());
  peers->clear();
  peers->resize(nranks);
  // Dialling completes in the peer's listen backlog, so every rank finishes
  // its dials before anyone accepts.
  for (int peer = 0; peer < rank; ++peer) {
    Handshake hello{kHandshakeMagic, rank, nonce};
    FAKENCCL_TRY(connectTo(table[peer], "rank " + std::to_string(peer), &(*peers)[peer]));
    FAKENCCL_TRY(sendAll((*peers)[peer], &hello, sizeof(hello)));
  }
  for (int accepted = 0; accepted < nranks - 1 - rank; ++accepted) {
    Fd connection;
    Handshake hello;
    FAKENCCL_TRY(acceptFrom(listener, &connection));
    FAKENCCL_TRY(recvAll(connection, &hello, sizeof(hello)));
    const bool expected = hello.magic == kHandshakeMagic && hello.nonce == nonce && hello.rank > rank &&
                          hello.rank < nranks && !(*peers)[hello.rank].valid();
    if (!expected) {
      return fail(ncclInternalError, "rank %d: unexpected connection while wiring the mesh (claims rank %d)", rank,
                  hello.rank);
    }
    (*peers)[hello.rank] = std::move(connection);
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != rank) FAKENCCL_TRY(makeDataConnection((*peers)[peer]));
  }
  return ncclSuccess;
}

}  // namespace rankscope::fakenccl
