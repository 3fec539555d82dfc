#include "collector/alert/drain.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/log.h"

extern char** environ;

namespace rankscope::collector {

namespace {
// Slurm keeps the reason as text; what goes in is ours and printable.
std::string printable(const std::string& text, size_t limit) {
  std::string out;
  for (char c : text) {
    if (out.size() >= limit) break;
    out += c >= ' ' && c <= '~' ? c : '_';
  }
  return out;
}
}  // namespace

NodeDrainer::~NodeDrainer() {
  for (const Running& r : running_) {
    kill(r.pid, SIGKILL);
    waitpid(r.pid, nullptr, 0);
  }
}

void NodeDrainer::evaluate(const std::vector<const Finding*>& findings, uint64_t now_ns) {
  collect(now_ns);
  if (options_.after_jobs == 0) return;
  // Per node: the jobs its ranks straggled in within the window, and the findings that say so.
  std::map<std::string, std::pair<std::set<std::string>, std::vector<uint64_t>>> straggled;
  const uint64_t since = now_ns > options_.window_ns ? now_ns - options_.window_ns : 0;
  for (const Finding* f : findings) {
    if (f->kind != FindingKind::straggler || f->opened_ns < since || f->job.empty()) continue;
    for (const std::string& node : f->nodes) {
      auto& [jobs, ids] = straggled[node];
      if (jobs.insert(f->job).second) ids.push_back(f->id);
    }
  }
  for (const auto& [node, seen] : straggled) {
    const auto& [jobs, ids] = seen;
    if (jobs.size() < options_.after_jobs) continue;
    if (auto acted = acted_.find(node); acted != acted_.end() && now_ns - acted->second < options_.window_ns) continue;
    acted_[node] = now_ns;
    std::string list, findings_list;
    for (const std::string& job : jobs) list += (list.empty() ? "" : ", ") + job;
    for (uint64_t id : ids) findings_list += (findings_list.empty() ? "#" : ", #") + std::to_string(id);
    Action action;
    action.node = node;
    action.dry_run = options_.dry_run;
    action.argv = {options_.command, "update", "NodeName=" + printable(node, 255), "State=DRAIN",
                   "Reason=" + printable("rankscope: straggler in " + std::to_string(jobs.size()) + " jobs (" + list +
                                             "; findings " + findings_list + ")",
                                         200)};
    std::string shown;
    for (const std::string& arg : action.argv) shown += (shown.empty() ? "" : " ") + arg;
    if (options_.dry_run) {
      action.done = true;
      RS_LOG(warn, "node %s straggled in %zu jobs: would run (--drain-dry-run): %s", node.c_str(), jobs.size(),
             shown.c_str());
      actions_.push_back(std::move(action));
      continue;
    }
    std::vector<char*> argv;
    for (std::string& arg : action.argv) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    int error = posix_spawnp(&pid, options_.command.c_str(), nullptr, nullptr, argv.data(), environ);
    if (error != 0) {
      action.done = true;
      RS_LOG(error, "node %s straggled in %zu jobs, but %s could not start (%s): not drained", node.c_str(),
             jobs.size(), options_.command.c_str(), std::strerror(error));
      actions_.push_back(std::move(action));
      continue;
    }
    RS_LOG(warn, "node %s straggled in %zu jobs: draining it: %s", node.c_str(), jobs.size(), shown.c_str());
    running_.push_back(Running{pid, actions_.size(), now_ns});
    actions_.push_back(std::move(action));
  }
}

void NodeDrainer::collect(uint64_t now_ns) {
  for (auto it = running_.begin(); it != running_.end();) {
    Action& action = actions_[it->action];
    int status = 0;
    pid_t done = waitpid(it->pid, &status, WNOHANG);
    if (done == 0 && now_ns - it->started_ns >= options_.timeout_ns) {
      kill(it->pid, SIGKILL);
      waitpid(it->pid, &status, 0);
      RS_LOG(error, "draining node %s: %s did not finish within %llu s; killed", action.node.c_str(),
             options_.command.c_str(), static_cast<unsigned long long>(options_.timeout_ns / 1'000'000'000ull));
      action.done = true;
      it = running_.erase(it);
      continue;
    }
    if (done == 0) {
      ++it;
      continue;
    }
    action.done = true;
    action.exit_status = done == it->pid && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (action.exit_status == 0)
      RS_LOG(warn, "node %s drained (%s)", action.node.c_str(), options_.command.c_str());
    else
      RS_LOG(error, "draining node %s: %s failed (exit status %d); see its output above", action.node.c_str(),
             options_.command.c_str(), action.exit_status);
    it = running_.erase(it);
  }
}

}  // namespace rankscope::collector
