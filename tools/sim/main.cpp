// rankscope-sim: a simulated GPU fleet that speaks the real agent protocol
// to a real collector, with ground truth, and the tools that score what the
// collector found against it.
#include <sys/resource.h>

#include <boost/program_options.hpp>
#include <iostream>
#include <set>

#include "common/log.h"
#include "tools/sim/flood.h"
#include "tools/sim/run.h"
#include "tools/sim/score.h"

namespace po = boost::program_options;
using namespace rankscope::sim;

namespace {
const char* kUsage =
    "rankscope-sim: a simulated GPU fleet for the rankscope collector, with ground truth.\n\n"
    "Usage:\n"
    "  rankscope-sim run   --collector EP --truth FILE [fleet and fault options]\n"
    "        N nodes x G ranks, each node its own agent connection; writes the truth to FILE at the end\n"
    "  rankscope-sim score --query EP --truth FILE [--out SCORES]\n"
    "        compares the collector's findings, status and timelines with the truth\n"
    "  rankscope-sim report SCORES...\n"
    "        the accuracy table of many scored runs (Markdown)\n"
    "  rankscope-sim flood --collector EP --query EP --ranks N [--steps S]\n"
    "        ingest throughput: pre-built batches of an N-rank job as fast as the collector acks them\n\n";

int fail(const std::string& message) {
  std::cerr << "rankscope-sim: " << message << "\n(see rankscope-sim --help)\n";
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  rankscope::log::set_program("rankscope-sim");
  // A connection per simulated node: a thousand nodes need more descriptors
  // than the usual soft limit of 1024.
  rlimit descriptors{};
  if (getrlimit(RLIMIT_NOFILE, &descriptors) == 0 && descriptors.rlim_cur < descriptors.rlim_max) {
    descriptors.rlim_cur = descriptors.rlim_max;
    setrlimit(RLIMIT_NOFILE, &descriptors);
  }
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string command = argv[1];
  FleetConfig fleet;
  RunOptions run;
  ScoreOptions score;
  FloodOptions flood;
  std::vector<std::string> files;
  std::string log_level = "info";
  po::options_description desc("Options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("collector", po::value(&run.collector)->default_value(run.collector), "the collector's agent endpoint")
    ("query", po::value(&score.query)->default_value(score.query), "the collector's query endpoint")
    ("truth", po::value<std::string>(), "ground-truth file (JSON lines): written by run, read by score")
    ("out", po::value(&score.out), "score: append the scored lines to this file")
    ("duration-s", po::value(&run.duration_s)->default_value(run.duration_s), "run: seconds of real time")
    ("nominal-step-s", po::value(&run.nominal_step_s)->default_value(run.nominal_step_s), "run: the real step time one simulated step stands for (for job-days)")
    ("seed", po::value(&fleet.seed)->default_value(fleet.seed), "random seed: the same seed gives the same records")
    ("prefix", po::value(&fleet.prefix)->default_value(fleet.prefix), "node and job names start with this")
    ("scenario", po::value(&fleet.scenario)->default_value(fleet.scenario), "healthy | slowdown | node-slowdown | hang | hang-stop | hang-kill | mismatch | agent-death | mixed")
    ("pattern", po::value(&fleet.pattern), "the jobs' training loop: ddp | sync-each | fsdp | pipeline | tp-dp | accum | jitter (default: tensor, pipeline and data parallel together; tools/sim/model.h)")
    ("layers", po::value(&fleet.layers)->default_value(fleet.layers), "fsdp: layers (an AllGather forward, an AllGather and a ReduceScatter backward each)")
    ("accum-steps", po::value(&fleet.accum_steps)->default_value(fleet.accum_steps), "accum: micro-steps per step with collectives")
    ("jobs", po::value(&fleet.jobs)->default_value(fleet.jobs), "jobs running side by side")
    ("nodes-per-job", po::value(&fleet.nodes_per_job)->default_value(fleet.nodes_per_job), "nodes of each job (a multiple of --pp)")
    ("gpus", po::value(&fleet.gpus)->default_value(fleet.gpus), "ranks per node (the tensor-parallel group)")
    ("pp", po::value(&fleet.pp)->default_value(fleet.pp), "pipeline stages, across nodes")
    ("step-ms", po::value(&fleet.step_ms)->default_value(fleet.step_ms), "mean step time")
    ("tp-ops", po::value(&fleet.tp_ops)->default_value(fleet.tp_ops), "tensor-parallel AllReduces per step")
    ("dp-buckets", po::value(&fleet.dp_buckets)->default_value(fleet.dp_buckets), "data-parallel buckets per step")
    ("world-op", po::value(&fleet.world_op)->default_value(fleet.world_op), "one AllReduce over all ranks per step")
    ("jitter", po::value(&fleet.jitter_sigma)->default_value(fleet.jitter_sigma), "log-normal sigma of compute times")
    ("gc-rate", po::value(&fleet.gc_rate)->default_value(fleet.gc_rate), "GC-like pauses per rank per step")
    ("last-stage-factor", po::value(&fleet.last_stage_factor)->default_value(fleet.last_stage_factor), "the last pipeline stage computes this much longer (benign)")
    ("max-drift-ppm", po::value(&fleet.max_drift_ppm)->default_value(fleet.max_drift_ppm), "node clock drift, drawn in +/- this")
    ("max-skew-s", po::value(&fleet.max_skew_s)->default_value(fleet.max_skew_s), "node wall-clock skew, drawn log-uniformly from 1 us to this")
    ("probe-jitter-ms", po::value(&fleet.probe_jitter_ms)->default_value(fleet.probe_jitter_ms), "mean extra round trip of clock probes (exponential)")
    ("batch-loss", po::value(&fleet.batch_loss)->default_value(fleet.batch_loss), "share of batch sends lost (re-sent after the ack timeout)")
    ("batch-reorder", po::value(&fleet.batch_reorder)->default_value(fleet.batch_reorder), "share of batches sent after the next one")
    ("record-loss", po::value(&fleet.record_loss)->default_value(fleet.record_loss), "share of records lost before the wire (ring buffer full)")
    ("fault-after-s", po::value(&fleet.fault_after_s)->default_value(fleet.fault_after_s), "faults start after this")
    ("fault-window-s", po::value(&fleet.fault_window_s)->default_value(fleet.fault_window_s), "... within this window")
    ("fault-duration-s", po::value(&fleet.fault_duration_s)->default_value(fleet.fault_duration_s), "slowdowns end after this (0: never)")
    ("factor", po::value(&fleet.factor)->default_value(fleet.factor), "slowdown factor (0: drawn log-uniformly in [min-factor, max-factor])")
    ("min-factor", po::value(&fleet.min_factor)->default_value(fleet.min_factor), "")
    ("max-factor", po::value(&fleet.max_factor)->default_value(fleet.max_factor), "")
    ("culprits", po::value(&fleet.culprits_per_job)->default_value(fleet.culprits_per_job), "slowed ranks (nodes) per job")
    ("slowdown-shape", po::value(&fleet.slowdown_shape)->default_value(fleet.slowdown_shape),
     "even (every compute segment factor x longer) | stalls (full speed, then a stop once the extra time owed reaches --stall-ms: a CPU quota, CPU hogs)")
    ("stall-ms", po::value(&fleet.stall_ms)->default_value(fleet.stall_ms), "slowdown-shape stalls: the least stall")
    ("ranks", po::value(&flood.ranks)->default_value(flood.ranks), "flood: ranks of the job")
    ("steps", po::value(&flood.steps)->default_value(flood.steps), "flood: steps of the job")
    ("steps-per-batch", po::value(&flood.steps_per_batch)->default_value(flood.steps_per_batch), "flood: steps in one batch of a node")
    ("history-steps", po::value(&flood.history_steps)->default_value(flood.history_steps), "flood: steps of the one-node job whose 1-hour timeline is asked")
    ("collector-pid", po::value(&flood.collector_pid)->default_value(0), "flood: read the collector's memory use from /proc")
    ("columns", po::bool_switch(&flood.columns), "flood: batches as to a collector that does not read them compact (CollectiveColumns, not compressed)")
    ("log-level", po::value(&log_level)->default_value(log_level), "error, warn, info or debug")
    ("files", po::value(&files), "report: score files");
  // clang-format on
  po::positional_options_description positional;
  positional.add("files", -1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc - 1, argv + 1).options(desc).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return fail(e.what());
  }
  if (vm.count("help")) {
    std::cout << kUsage << desc << "\n";
    return 0;
  }
  if (!rankscope::log::set_level(log_level)) return fail("--log-level must be error, warn, info or debug");
  if (command == "run") {
    if (!vm.count("truth")) return fail("run needs --truth FILE");
    run.truth = vm["truth"].as<std::string>();
    if (fleet.jobs < 1 || fleet.nodes_per_job < 1 || fleet.gpus < 1 || fleet.pp < 1)
      return fail("--jobs, --nodes-per-job, --gpus and --pp must be at least 1");
    if (std::string why; !rankscope::sim::apply_pattern(fleet, &why)) return fail(why);
    if (fleet.nodes_per_job % fleet.pp != 0) return fail("--nodes-per-job must be a multiple of --pp");
    static const std::set<std::string> scenarios = {"healthy",   "slowdown", "node-slowdown", "hang",  "hang-stop",
                                                    "hang-kill", "mismatch", "agent-death",   "mixed"};
    if (!scenarios.count(fleet.scenario)) return fail("unknown --scenario " + fleet.scenario);
    if (fleet.step_ms <= 0 || run.duration_s <= 0) return fail("--step-ms and --duration-s must be positive");
    if (fleet.slowdown_shape != "even" && fleet.slowdown_shape != "stalls")
      return fail("unknown --slowdown-shape " + fleet.slowdown_shape + " (even | stalls)");
    if (!(fleet.stall_ms > 0)) return fail("--stall-ms must be positive");
    return run_fleet(fleet, run);
  }
  if (command == "score") {
    if (!vm.count("truth")) return fail("score needs --truth FILE");
    score.truth = vm["truth"].as<std::string>();
    return score_run(score);
  }
  if (command == "report") {
    if (files.empty()) return fail("report needs score files");
    return report(files);
  }
  if (command == "flood") {
    flood.collector = run.collector;
    flood.query = score.query;
    flood.seed = fleet.seed;
    return run_flood(flood);
  }
  return fail("unknown command " + command);
}
