// fakenccl-train: the communication pattern of a data-parallel training job.
//
// Each step computes on the CPU (a fixed amount of floating-point work, so a
// busy or throttled core really makes the rank late), then all-reduces K
// gradient buckets on one stream and waits for them. It uses nothing but
// nccl.h, cuda_runtime_api.h and the standard library, so the same binary
// runs on fakenccl and, with LD_LIBRARY_PATH=/usr/local/cuda/lib, on NVIDIA's
// libraries.

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

struct Options {
  std::string idFile;
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
    "usage: fakenccl-train --id-file PATH [--steps N] [--buckets K] [--bucket-elems E]\n"
    "                      [--compute-iters I] [--check] [--record FILE]\n"
    "                      [--mismatch-at-step S] [--quiet]\n"
    "\n"
    "Runs one rank of a data-parallel training loop over NCCL. The rank and world\n"
    "size come from RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or\n"
    "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE; the local rank (which GPU) from\n"
    "LOCAL_RANK, SLURM_LOCALID or OMPI_COMM_WORLD_LOCAL_RANK.\n"
    "\n"
    "  --id-file PATH         rank 0 writes the ncclUniqueId here; the others wait for it\n"
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

struct Buffers {
  std::vector<float*> device;  // one per bucket, all-reduced in place
  std::vector<float*> host;    // pinned staging, one per bucket
  float* gathered = nullptr;   // AllGather target for --mismatch-at-step
};

Buffers allocateBuffers(const Options& options, const World& world) {
  Buffers buffers;
  const size_t bytes = options.bucketElems * sizeof(float);
  for (int b = 0; b < options.buckets; ++b) {
    void* device = nullptr;
    void* host = nullptr;
    checkCuda(cudaMalloc(&device, bytes), "cudaMalloc");
    checkCuda(cudaMallocHost(&host, bytes), "cudaMallocHost");
    buffers.device.push_back(static_cast<float*>(device));
    buffers.host.push_back(static_cast<float*>(host));
  }
  if (options.mismatchAtStep >= 0) {
    void* gathered = nullptr;
    checkCuda(cudaMalloc(&gathered, bytes * world.size), "cudaMalloc");
    buffers.gathered = static_cast<float*>(gathered);
  }
  return buffers;
}

void freeBuffers(Buffers& buffers) {
  for (float* device : buffers.device) checkCuda(cudaFree(device), "cudaFree");
  for (float* host : buffers.host) checkCuda(cudaFreeHost(host), "cudaFreeHost");
  if (buffers.gathered != nullptr) checkCuda(cudaFree(buffers.gathered), "cudaFree");
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

// Returns the collectives issued.
int runStep(const Options& options, const World& world, int step, ncclComm_t comm, cudaStream_t stream,
            Buffers& buffers, CallRecorder& recorder) {
  gComputeSink = compute(options.computeIters, step);

  const size_t count = options.bucketElems;
  const size_t bytes = count * sizeof(float);
  for (int b = 0; b < options.buckets; ++b) {
    for (size_t i = 0; i < count; ++i) buffers.host[b][i] = gradientValue(world.rank, step, b, i);
    checkCuda(cudaMemcpyAsync(buffers.device[b], buffers.host[b], bytes, cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync");
  }
  for (int b = 0; b < options.buckets; ++b) {
    if (b == 0 && step == options.mismatchAtStep) {
      recorder.record("AllGather", count, "float32", bytes);
      checkNccl(ncclAllGather(buffers.device[b], buffers.gathered, count, ncclFloat32, comm, stream), "ncclAllGather");
    } else {
      recorder.record("AllReduce", count, "float32", bytes);
      checkNccl(ncclAllReduce(buffers.device[b], buffers.device[b], count, ncclFloat32, ncclSum, comm, stream),
                "ncclAllReduce");
    }
  }
  checkCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return options.buckets;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parseOptions(argc, argv);
  const World world = worldFromEnvironment();
  gRank = world.rank;
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

  cudaStream_t stream = nullptr;
  checkCuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  Buffers buffers = allocateBuffers(options, world);

  int collectives = 0;
  double totalMs = 0;
  for (int step = 0; step < options.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    collectives += runStep(options, world, step, comm, stream, buffers, recorder);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    totalMs += ms;
    if (options.check) verify(options, world, step, buffers);
    if (!options.quiet) {
      std::printf("fakenccl-train rank %d/%d: step %d done in %.1f ms\n", world.rank, world.size, step, ms);
      std::fflush(stdout);
    }
  }

  freeBuffers(buffers);
  checkCuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  recorder.record("CommDestroy", 0, "-", 0);
  checkNccl(ncclCommDestroy(comm), "ncclCommDestroy");

  std::printf("fakenccl-train rank %d/%d: %d steps, %d collectives, mean step %.1f ms, %s\n", world.rank, world.size,
              options.steps, collectives, options.steps > 0 ? totalMs / options.steps : 0.0,
              options.check ? "check ok" : "not checked");
  return 0;
}
