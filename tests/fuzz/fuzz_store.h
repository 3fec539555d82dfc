#pragma once
// A real TimelineStore for the fuzz targets, in a fresh folder on tmpfs
// ($RANKSCOPE_FUZZ_TMP, else /dev/shm when there is one): the store's synced
// commits then cost no disk flush. The folder goes when the process exits.
#include <memory>
#include <string>

#include "collector/store/timeline_store.h"

namespace rankscope::fuzz {

class FuzzStore {
 public:
  FuzzStore();
  ~FuzzStore();
  collector::TimelineStore& store() { return *store_; }
  // Starts over with an empty database (keeps a long run's tmpfs use bounded).
  void reset();

 private:
  void open();
  std::string dir_;
  std::unique_ptr<collector::TimelineStore> store_;
};

}  // namespace rankscope::fuzz
