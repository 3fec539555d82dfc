#pragma once
// Scoring: the ground truth a run wrote against what the collector found
// (its findings, status and timelines, asked over the query socket as the
// CLI does), and the summary of many scored runs.
#include <string>
#include <vector>

namespace rankscope::sim {

struct ScoreOptions {
  std::string query = "tcp://127.0.0.1:7601";
  std::string truth;
  std::string out;        // append the scored lines here (JSON lines); "" prints them
  bool quiet = false;
};
int score_run(const ScoreOptions& options);

// Reads scored lines from `files` and prints the accuracy table (Markdown).
int report(const std::vector<std::string>& files);

}  // namespace rankscope::sim
