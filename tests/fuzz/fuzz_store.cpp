#include "tests/fuzz/fuzz_store.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace rankscope::fuzz {

FuzzStore::FuzzStore() {
  // run-fuzzer.sh names a folder it removes afterwards, also after a crash.
  const char* given = getenv("RANKSCOPE_FUZZ_TMP");
  struct stat shm {};
  std::string base = given && *given ? given
                     : stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) ? "/dev/shm"
                                                                          : std::filesystem::temp_directory_path().string();
  std::string pattern = base + "/rankscope-fuzz-XXXXXX";
  if (!mkdtemp(pattern.data())) {
    perror("rankscope fuzz: mkdtemp");
    abort();
  }
  dir_ = pattern;
  open();
}

FuzzStore::~FuzzStore() {
  store_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void FuzzStore::open() {
  auto opened = collector::TimelineStore::open(dir_ + "/db");
  if (!opened) {
    fprintf(stderr, "rankscope fuzz: %s\n", opened.error().message.c_str());
    abort();
  }
  store_ = std::move(*opened);
}

void FuzzStore::reset() {
  store_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_ + "/db", ignored);
  open();
}

}  // namespace rankscope::fuzz
