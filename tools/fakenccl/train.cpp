// fakenccl-train: the communication patterns of common training jobs.
//
// Every step computes on the CPU (a fixed amount of floating-point work, so a
// busy or throttled core really makes the rank late) and communicates in the
// shape --pattern names: data-parallel buckets (ddp, the default), a host
// synchronisation after every collective (sync-each), per-layer AllGather and
// ReduceScatter (fsdp), pipeline stages over Send/Recv (pipeline), tensor
// parallelism inside a group and data parallelism across groups (tp-dp),
// gradient accumulation (accum), and data-dependent step times (jitter). It
// uses nothing but nccl.h, cuda_runtime_api.h and the standard library, so
// the same binary runs on fakenccl and, with LD_LIBRARY_PATH=/usr/local/cuda/lib,
// on NVIDIA's libraries.

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <nccl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

// About 15 ms of work on one idle core of the 2-core development VM.
constexpr long kDefaultComputeIters = 5'000'000;
constexpr auto kIdWaitTimeout = std::chrono::seconds(120);
constexpr auto kIdPollInterval = std::chrono::milliseconds(20);

int gRank = -1;  // for messages, once known

// Where compute() leaves its result, so the compiler cannot drop the work.
volatile double gComputeSink;

[[noreturn]] void die(const char* format, ...) __attribute__((format(printf, 1, 2)));

void die(const char* format, ...) {
  char message[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  if (gRank >= 0) {
    std::fprintf(stderr, "fakenccl-train rank %d: %s\n", gRank, message);
  } else {
    std::fprintf(stderr, "fakenccl-train: %s\n", message);
  }
  std::exit(1);
}

void checkCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) die("%s failed: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error));
}

void checkNccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) die("%s failed: %s", what, ncclGetErrorString(result));
}

// ------------------------------------------------------------- options --

enum class Pattern { ddp, sync_each, fsdp, pipeline, tp_dp, accum, jitter };

struct Options {
  std::string idFile;
  Pattern pattern = Pattern::ddp;
  int layers = 0;        // fsdp, tp-dp (0: the pattern's default)
  int microBatches = 0;  // pipeline, accum (0: the pattern's default)
  int groupSize = 0;     // tp-dp: ranks per tensor-parallel group; pipeline: stages (0: default)
  int steps = 100;
  int buckets = 3;
  size_t bucketElems = 65536;
  long computeIters = kDefaultComputeIters;
  bool check = false;
  std::string recordFile;
  int mismatchAtStep = -1;
  bool quiet = false;
};

constexpr const char* kUsage =
    "usage: fakenccl-train --id-file PATH [--pattern NAME] [--steps N] [--buckets K]\n"
    "                      [--bucket-elems E] [--compute-iters I] [--layers L]\n"
    "                      [--micro-batches M] [--group-size G] [--check] [--record FILE]\n"
    "                      [--mismatch-at-step S] [--quiet]\n"
    "\n"
    "Runs one rank of a training loop over NCCL. The rank and world size come from\n"
    "RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or\n"
    "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE; the local rank (which GPU) from\n"
    "LOCAL_RANK, SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK.\n"
    "\n"
    "  --id-file PATH         rank 0 writes the ncclUniqueId here; the others wait for it\n"
    "  --pattern NAME         what a step does after (and between) its CPU work:\n"
    "                           ddp        all-reduce K buckets back to back, one\n"
    "                                      synchronize per step (default)\n"
    "                           sync-each  per bucket: all-reduce, synchronize, copy to\n"
    "                                      the host\n"
    "                           fsdp       per layer an AllGather (forward) and a\n"
    "                                      ReduceScatter (backward): 2 x L calls\n"
    "                           pipeline   G stages over Send/Recv, M micro-batches\n"
    "                                      forward then backward, then an AllReduce\n"
    "                                      across the data-parallel replicas (split\n"
    "                                      communicator) and one over all ranks\n"
    "                           tp-dp      two communicators per rank: an AllReduce per\n"
    "                                      layer inside each group of G consecutive ranks\n"
    "                                      (tensor parallel), the buckets across groups\n"
    "                           accum      the buckets only every M-th step (gradient\n"
    "                                      accumulation over M micro-steps)\n"
    "                           jitter     ddp with each rank's CPU work drawn per step\n"
    "                                      between 0.5x and 1.5x (data-dependent steps)\n"
    "  --layers L             fsdp (default 100), tp-dp (default 4)\n"
    "  --micro-batches M      pipeline (default 4), accum (default 4)\n"
    "  --group-size G         pipeline stages (default 2), tp-dp group (default 2);\n"
    "                         must divide the world size\n"
    "  --steps N              training steps (default 100)\n"
    "  --buckets K            gradient buckets all-reduced per step (default 3)\n"
    "  --bucket-elems E       float32 elements per bucket (default 65536)\n"
    "  --compute-iters I      CPU work per step, in loop iterations (default 5000000,\n"
    "                         about 15 ms on one idle core)\n"
    "  --check                verify every reduced element against the exact sum\n"
    "  --record FILE          append '<index> <op> <count> <datatype> <bytes>' per NCCL call\n"
    "  --mismatch-at-step S   at step S, call ncclAllGather instead of the first\n"
    "                         bucket's ncclAllReduce (the job then hangs, as with NCCL)\n"
    "  --quiet                print only the final summary line\n";

[[noreturn]] void usageError(const char* format, const char* value) {
  std::fprintf(stderr, "fakenccl-train: ");
  std::fprintf(stderr, format, value);
  std::fprintf(stderr, "\n\n%s", kUsage);
  std::exit(2);
}

long parseNumber(const char* flag, const char* text, long minimum) {
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < minimum) {
    usageError("bad value for %s", flag);
  }
  return value;
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usageError("%s needs a value", flag.c_str());
      return argv[++i];
    };
    if (flag == "--id-file") {
      options.idFile = value();
    } else if (flag == "--pattern") {
      const std::string name = value();
      if (name == "ddp") options.pattern = Pattern::ddp;
      else if (name == "sync-each") options.pattern = Pattern::sync_each;
      else if (name == "fsdp") options.pattern = Pattern::fsdp;
      else if (name == "pipeline") options.pattern = Pattern::pipeline;
      else if (name == "tp-dp") options.pattern = Pattern::tp_dp;
      else if (name == "accum") options.pattern = Pattern::accum;
      else if (name == "jitter") options.pattern = Pattern::jitter;
      else usageError("unknown --pattern %s", name.c_str());
    } else if (flag == "--layers") {
      options.layers = static_cast<int>(parseNumber("--layers", value(), 1));
    } else if (flag == "--micro-batches") {
      options.microBatches = static_cast<int>(parseNumber("--micro-batches", value(), 1));
    } else if (flag == "--group-size") {
      options.groupSize = static_cast<int>(parseNumber("--group-size", value(), 1));
    } else if (flag == "--steps") {
      options.steps = static_cast<int>(parseNumber("--steps", value(), 0));
    } else if (flag == "--buckets") {
      options.buckets = static_cast<int>(parseNumber("--buckets", value(), 1));
    } else if (flag == "--bucket-elems") {
      options.bucketElems = static_cast<size_t>(parseNumber("--bucket-elems", value(), 1));
    } else if (flag == "--compute-iters") {
      options.computeIters = parseNumber("--compute-iters", value(), 0);
    } else if (flag == "--check") {
      options.check = true;
    } else if (flag == "--record") {
      options.recordFile = value();
    } else if (flag == "--mismatch-at-step") {
      options.mismatchAtStep = static_cast<int>(parseNumber("--mismatch-at-step", value(), 0));
    } else if (flag == "--quiet") {
      options.quiet = true;
    } else if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      usageError("unknown option %s", flag.c_str());
    }
  }
  if (options.idFile.empty()) usageError("%s is required", "--id-file");
  if (options.layers == 0) options.layers = options.pattern == Pattern::fsdp ? 100 : 4;
  if (options.microBatches == 0) options.microBatches = 4;
  if (options.groupSize == 0) options.groupSize = 2;
  if (options.mismatchAtStep >= 0 && options.pattern != Pattern::ddp)
    usageError("%s is for --pattern ddp", "--mismatch-at-step");
  return options;
}

// --------------------------------------------------------------- world --

struct World {
  int rank;
  int size;
  int localRank;
};

std::optional<int> envInt(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0) die("%s=%s is not a non-negative integer", name, text);
  return static_cast<int>(value);
}

// The launchers' conventions: torchrun, Slurm's srun, Open MPI's mpirun.
World worldFromEnvironment() {
  const char* sources[][3] = {{"RANK", "WORLD_SIZE", "LOCAL_RANK"},
                              {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                              {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"}};
  for (const auto& names : sources) {
    std::optional<int> rank = envInt(names[0]);
    std::optional<int> size = envInt(names[1]);
    if (!rank || !size) continue;
    if (*size < 1 || *rank >= *size) die("%s=%d does not fit %s=%d", names[0], *rank, names[1], *size);
    return World{*rank, *size, envInt(names[2]).value_or(0)};
  }
  die("no rank in the environment: set RANK and WORLD_SIZE (or run under srun or mpirun)");
}

// ----------------------------------------------------------- unique id --

void writeIdAtomically(const std::string& path, const ncclUniqueId& id) {
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) die("cannot create %s: %s", temporary.c_str(), std::strerror(errno));
  const bool written = std::fwrite(&id, sizeof(id), 1, file) == 1;
  if (std::fclose(file) != 0 || !written) die("cannot write %s", temporary.c_str());
  // rename() within one folder is atomic: readers see no file or all of it.
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    die("cannot rename %s to %s: %s", temporary.c_str(), path.c_str(), std::strerror(errno));
  }
}

bool readId(const std::string& path, ncclUniqueId* id) {
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return false;
  const bool complete = std::fread(id, sizeof(*id), 1, file) == 1;
  std::fclose(file);
  return complete;
}

ncclUniqueId waitForId(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + kIdWaitTimeout;
  ncclUniqueId id;
  while (!readId(path, &id)) {
    if (std::chrono::steady_clock::now() > deadline) {
      die("no NCCL unique id in %s after %lld s; is rank 0 running with the same --id-file?", path.c_str(),
          static_cast<long long>(kIdWaitTimeout.count()));
    }
    std::this_thread::sleep_for(kIdPollInterval);
  }
  return id;
}

// -------------------------------------------------------------- record --

// --record: one line per NCCL call, written (unbuffered) as the call is
// made, so the file is complete even if the rank hangs and is killed.
class CallRecorder {
 public:
  explicit CallRecorder(const std::string& path) {
    if (path.empty()) return;
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) die("cannot open --record file %s: %s", path.c_str(), std::strerror(errno));
  }
  ~CallRecorder() {
    if (fd_ >= 0) ::close(fd_);
  }
  CallRecorder(const CallRecorder&) = delete;
  CallRecorder& operator=(const CallRecorder&) = delete;

  void record(const char* op, size_t count, const char* datatype, size_t bytes) {
    if (fd_ < 0) return;
    char line[128];
    int length = std::snprintf(line, sizeof(line), "%" PRIu64 " %s %zu %s %zu\n", next_++, op, count, datatype, bytes);
    if (::write(fd_, line, static_cast<size_t>(length)) != length) {
      die("cannot write to the --record file: %s", std::strerror(errno));
    }
  }

 private:
  int fd_ = -1;
  uint64_t next_ = 0;
};

// ---------------------------------------------------------------- step --

// A dependent chain of multiply-adds: its cost is the iteration count, not
// wall time, so contention for the core stretches it.
double compute(long iterations, double seed) {
  double x = seed;
  for (long i = 0; i < iterations; ++i) x = x * 0.9999999 + 1e-7;
  return x;
}

// Small integers: their sums over any number of ranks are exact in float32.
float gradientValue(int rank, int step, int bucket, size_t index) {
  const size_t mixed =
      static_cast<size_t>(rank) * 7 + static_cast<size_t>(step) * 3 + static_cast<size_t>(bucket) * 5 + index;
  return static_cast<float>(static_cast<int>(mixed % 13) - 6);
}

float expectedSum(int worldSize, int step, int bucket, size_t index) {
  float sum = 0;
  for (int r = 0; r < worldSize; ++r) sum += gradientValue(r, step, bucket, index);
  return sum;
}

// splitmix64: the same stream of numbers on every machine.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The communicators a pattern uses besides the world: tp-dp's tensor-parallel
// group (inner) and data-parallel group (outer); pipeline's data-parallel
// replicas of the same stage (outer, when there are several replicas).
struct Comms {
  ncclComm_t world = nullptr;
  ncclComm_t inner = nullptr;
  ncclComm_t outer = nullptr;
};

struct Buffers {
  std::vector<float*> device;  // one per bucket, all-reduced in place
  std::vector<float*> host;    // pinned staging, one per bucket
  float* gathered = nullptr;   // world.size buckets: AllGather and ReduceScatter targets
  float* shard = nullptr;      // one bucket: an FSDP shard, a pipeline stage's input
};

float* deviceFloats(size_t count) {
  void* device = nullptr;
  checkCuda(cudaMalloc(&device, count * sizeof(float)), "cudaMalloc");
  return static_cast<float*>(device);
}

Buffers allocateBuffers(const Options& options, const World& world) {
  Buffers buffers;
  const size_t bytes = options.bucketElems * sizeof(float);
  for (int b = 0; b < options.buckets; ++b) {
    void* host = nullptr;
    checkCuda(cudaMallocHost(&host, bytes), "cudaMallocHost");
    buffers.device.push_back(deviceFloats(options.bucketElems));
    buffers.host.push_back(static_cast<float*>(host));
  }
  buffers.gathered = deviceFloats(options.bucketElems * world.size);
  buffers.shard = deviceFloats(options.bucketElems);
  return buffers;
}

void freeBuffers(Buffers& buffers) {
  for (float* device : buffers.device) checkCuda(cudaFree(device), "cudaFree");
  for (float* host : buffers.host) checkCuda(cudaFreeHost(host), "cudaFreeHost");
  checkCuda(cudaFree(buffers.gathered), "cudaFree");
  checkCuda(cudaFree(buffers.shard), "cudaFree");
}

void verify(const Options& options, const World& world, int step, const Buffers& buffers) {
  const size_t bytes = options.bucketElems * sizeof(float);
  for (int b = 0; b < options.buckets; ++b) {
    checkCuda(cudaMemcpy(buffers.host[b], buffers.device[b], bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < options.bucketElems; ++i) {
      const float expected = expectedSum(world.size, step, b, i);
      if (buffers.host[b][i] != expected) {
        die("check failed at step %d bucket %d element %zu: got %g, expected %g", step, b, i,
            static_cast<double>(buffers.host[b][i]), static_cast<double>(expected));
      }
    }
  }
}

// One step of a pattern; returns the NCCL calls it made.
class Trainer {
 public:
  Trainer(const Options& options, const World& world, Comms comms, cudaStream_t stream, Buffers& buffers,
          CallRecorder& recorder)
      : o_(options), world_(world), comms_(comms), stream_(stream), buffers_(buffers), recorder_(recorder) {}

  int step(int step) {
    calls_ = 0;
    switch (o_.pattern) {
      case Pattern::ddp: ddp(step, o_.computeIters, false); break;
      case Pattern::sync_each: ddp(step, o_.computeIters, true); break;
      case Pattern::jitter: {
        // Each rank's batch differs: 0.5x to 1.5x the work, drawn per (rank, step).
        const double share = 0.5 + static_cast<double>(mix(static_cast<uint64_t>(world_.rank) << 32 | step) >> 11) /
                                        static_cast<double>(1ull << 53);
        ddp(step, static_cast<long>(static_cast<double>(o_.computeIters) * share), false);
        break;
      }
      case Pattern::accum:
        // A micro-step's work each step; the gradients are reduced every M-th.
        if (step % o_.microBatches == o_.microBatches - 1) ddp(step, o_.computeIters, false);
        else gComputeSink = compute(o_.computeIters, step);
        break;
      case Pattern::fsdp: fsdp(step); break;
      case Pattern::pipeline: pipeline(step); break;
      case Pattern::tp_dp: tpDp(step); break;
    }
    return calls_;
  }

 private:
  void synchronize() { checkCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void allReduce(float* buffer, size_t count, ncclComm_t comm) {
    recorder_.record("AllReduce", count, "float32", count * sizeof(float));
    checkNccl(ncclAllReduce(buffer, buffer, count, ncclFloat32, ncclSum, comm, stream_), "ncclAllReduce");
    ++calls_;
  }

  // The buckets' gradients, staged to the device.
  void stageGradients(int step) {
    const size_t count = o_.bucketElems;
    for (int b = 0; b < o_.buckets; ++b) {
      for (size_t i = 0; i < count; ++i) buffers_.host[b][i] = gradientValue(world_.rank, step, b, i);
      checkCuda(cudaMemcpyAsync(buffers_.device[b], buffers_.host[b], count * sizeof(float), cudaMemcpyHostToDevice,
                                stream_),
                "cudaMemcpyAsync");
    }
  }

  // Compute, then the buckets back to back and one synchronize; or (each)
  // a synchronize and a copy back to the host after every bucket.
  void ddp(int step, long iterations, bool each) {
    gComputeSink = compute(iterations, step);
    stageGradients(step);
    const size_t count = o_.bucketElems, bytes = count * sizeof(float);
    for (int b = 0; b < o_.buckets; ++b) {
      if (b == 0 && step == o_.mismatchAtStep) {
        recorder_.record("AllGather", count, "float32", bytes);
        checkNccl(ncclAllGather(buffers_.device[b], buffers_.gathered, count, ncclFloat32, comms_.world, stream_),
                  "ncclAllGather");
        ++calls_;
      } else {
        allReduce(buffers_.device[b], count, comms_.world);
      }
      if (each) {
        synchronize();
        checkCuda(cudaMemcpy(buffers_.host[b], buffers_.device[b], bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      }
    }
    synchronize();
  }

  // Forward: gather each layer's parameters, compute; backward: compute,
  // scatter each layer's gradients. The host runs ahead of the GPU.
  void fsdp(int step) {
    const long slice = std::max(1L, o_.computeIters / (2 * o_.layers));
    const size_t count = std::max<size_t>(1, o_.bucketElems / static_cast<size_t>(world_.size));
    for (int layer = 0; layer < o_.layers; ++layer) {
      recorder_.record("AllGather", count, "float32", count * sizeof(float));
      checkNccl(ncclAllGather(buffers_.shard, buffers_.gathered, count, ncclFloat32, comms_.world, stream_),
                "ncclAllGather");
      ++calls_;
      gComputeSink = compute(slice, step + layer);
    }
    for (int layer = o_.layers - 1; layer >= 0; --layer) {
      gComputeSink = compute(slice, step - layer);
      recorder_.record("ReduceScatter", count, "float32", count * sizeof(float));
      checkNccl(ncclReduceScatter(buffers_.gathered, buffers_.shard, count, ncclFloat32, ncclSum, comms_.world, stream_),
                "ncclReduceScatter");
      ++calls_;
    }
    synchronize();
  }

  void send(int peer, size_t count) {
    recorder_.record("Send", count, "float32", count * sizeof(float));
    checkNccl(ncclSend(buffers_.device[0], count, ncclFloat32, peer, comms_.world, stream_), "ncclSend");
    ++calls_;
  }
  // A stage needs what it receives before it computes on it.
  void receive(int peer, size_t count) {
    recorder_.record("Recv", count, "float32", count * sizeof(float));
    checkNccl(ncclRecv(buffers_.shard, count, ncclFloat32, peer, comms_.world, stream_), "ncclRecv");
    ++calls_;
    synchronize();
  }

  // G stages (rank % G) over Send/Recv, all micro-batches forward then all
  // backward; then the stage's gradients across its replicas and a small
  // AllReduce over every rank (the gradient norm).
  void pipeline(int step) {
    const int stages = o_.groupSize, stage = world_.rank % stages;
    const long slice = std::max(1L, o_.computeIters / (2 * o_.microBatches));
    const size_t count = o_.bucketElems;
    for (int m = 0; m < o_.microBatches; ++m) {
      if (stage > 0) receive(world_.rank - 1, count);
      gComputeSink = compute(slice, step + m);
      if (stage < stages - 1) send(world_.rank + 1, count);
    }
    for (int m = 0; m < o_.microBatches; ++m) {
      if (stage < stages - 1) receive(world_.rank + 1, count);
      gComputeSink = compute(slice, step - m);
      if (stage > 0) send(world_.rank - 1, count);
    }
    stageGradients(step);
    if (comms_.outer != nullptr)
      for (int b = 0; b < o_.buckets; ++b) allReduce(buffers_.device[b], count, comms_.outer);
    allReduce(buffers_.shard, 1, comms_.world);
    synchronize();
  }

  // Per layer, forward and backward: compute, then an AllReduce of the
  // activations inside the tensor-parallel group; then the buckets across
  // the data-parallel group.
  void tpDp(int step) {
    const long slice = std::max(1L, o_.computeIters / (2 * o_.layers));
    const size_t activations = std::max<size_t>(1, o_.bucketElems / 4);
    for (int pass = 0; pass < 2; ++pass) {
      for (int layer = 0; layer < o_.layers; ++layer) {
        gComputeSink = compute(slice, step + layer);
        allReduce(buffers_.shard, activations, comms_.inner);
      }
    }
    stageGradients(step);
    for (int b = 0; b < o_.buckets; ++b) allReduce(buffers_.device[b], o_.bucketElems, comms_.outer);
    synchronize();
  }

  const Options& o_;
  const World& world_;
  Comms comms_;
  cudaStream_t stream_;
  Buffers& buffers_;
  CallRecorder& recorder_;
  int calls_ = 0;
};

ncclComm_t split(ncclComm_t parent, int color, int key, CallRecorder& recorder) {
  ncclComm_t child = nullptr;
  recorder.record("CommSplit", 0, "-", 0);
  checkNccl(ncclCommSplit(parent, color, key, &child, nullptr), "ncclCommSplit");
  return child;
}

// The communicators the pattern needs besides the world (every rank splits,
// as NCCL requires).
Comms makeComms(const Options& options, const World& world, ncclComm_t worldComm, CallRecorder& recorder) {
  Comms comms;
  comms.world = worldComm;
  const int g = options.groupSize;
  if (options.pattern == Pattern::tp_dp) {
    comms.inner = split(worldComm, world.rank / g, world.rank % g, recorder);
    comms.outer = split(worldComm, world.rank % g, world.rank / g, recorder);
  } else if (options.pattern == Pattern::pipeline && world.size / g > 1) {
    comms.outer = split(worldComm, world.rank % g, world.rank / g, recorder);
  }
  return comms;
}

void destroy(ncclComm_t comm, CallRecorder& recorder) {
  if (comm == nullptr) return;
  recorder.record("CommDestroy", 0, "-", 0);
  checkNccl(ncclCommDestroy(comm), "ncclCommDestroy");
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parseOptions(argc, argv);
  const World world = worldFromEnvironment();
  gRank = world.rank;
  const bool grouped = options.pattern == Pattern::pipeline || options.pattern == Pattern::tp_dp;
  if (grouped && world.size % options.groupSize != 0)
    die("--group-size %d does not divide the world size %d", options.groupSize, world.size);
  const bool reducesBuckets = options.pattern == Pattern::ddp || options.pattern == Pattern::sync_each ||
                              options.pattern == Pattern::jitter || options.pattern == Pattern::accum;
  if (options.check && !reducesBuckets) die("--check verifies the buckets of ddp, sync-each, jitter and accum only");
  CallRecorder recorder(options.recordFile);

  int deviceCount = 0;
  checkCuda(cudaGetDeviceCount(&deviceCount), "cudaGetDeviceCount");
  checkCuda(cudaSetDevice(world.localRank % deviceCount), "cudaSetDevice");

  ncclUniqueId id;
  if (world.rank == 0) {
    checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    writeIdAtomically(options.idFile, id);
  } else {
    id = waitForId(options.idFile);
  }
  ncclComm_t comm = nullptr;
  recorder.record("CommInitRank", 0, "-", 0);
  checkNccl(ncclCommInitRank(&comm, world.size, id, world.rank), "ncclCommInitRank");

  const Comms comms = makeComms(options, world, comm, recorder);

  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  Buffers buffers = allocateBuffers(options, world);
  Trainer trainer(options, world, comms, stream, buffers, recorder);

  int collectives = 0;
  double totalMs = 0;
  for (int step = 0; step < options.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const int calls = trainer.step(step);
    collectives += calls;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    totalMs += ms;
    if (options.check && calls > 0) verify(options, world, step, buffers);
    if (!options.quiet) {
      std::printf("fakenccl-train rank %d/%d: step %d done in %.1f ms\n", world.rank, world.size, step, ms);
      std::fflush(stdout);
    }
  }

  freeBuffers(buffers);
  checkCuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  destroy(comms.inner, recorder);
  destroy(comms.outer, recorder);
  destroy(comm, recorder);

  std::printf("fakenccl-train rank %d/%d: %d steps, %d NCCL calls, mean step %.1f ms, %s\n", world.rank, world.size,
              options.steps, collectives, options.steps > 0 ? totalMs / options.steps : 0.0,
              options.check ? "check ok" : "not checked");
  return 0;
}
