// rankscope-bench-curve: what CurveZMQ costs the collector per message, against
// plaintext in the same run. A ROUTER socket (the collector's agent socket,
// with its key pair, or --insecure) receives batches of a given size from N
// DEALER connections (the agents, each with its own key pair) over TCP on
// loopback and answers each with a small ack, as the collector does. The
// figures: the receiving process's CPU time per message (all its threads:
// libzmq decrypts and encrypts on its I/O thread), and messages per second
// at full speed, the senders in a process of their own.
// docs/benchmarks.md, "CurveZMQ".
#include <boost/program_options.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "common/curve.h"

namespace po = boost::program_options;
using namespace rankscope;

namespace {

uint64_t wall_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct Figures {
  double messages_per_s = 0;
  double server_cpu_us_per_message = 0;  // the collector's side, all its threads: recv, decrypt, ack, encrypt
};

uint64_t process_cpu_ns() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto ns = [](const timeval& t) { return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_usec) * 1000ull; };
  return ns(usage.ru_utime) + ns(usage.ru_stime);
}

int free_tcp_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// The agents: `clients` connections send `per_client` messages of `size`
// bytes each, at most `window` unacknowledged (as agents keep a bounded
// number in flight). Runs in a child process of its own.
int send_all(const std::string& endpoint, const curve::KeyFile* server_key, int clients, int per_client, size_t size,
             int window) {
  zmq::context_t context(1);
  std::vector<zmq::socket_t> sockets;
  for (int c = 0; c < clients; ++c) {
    sockets.emplace_back(context, zmq::socket_type::dealer);
    zmq::socket_t& s = sockets.back();
    s.set(zmq::sockopt::linger, 0);
    if (server_key) {
      auto key = curve::generate("bench-agent-" + std::to_string(c), "agent");
      if (!key) return 1;
      curve::apply(s, curve::ClientKeys{key->public_key, key->secret_key, server_key->public_key});
    }
    s.connect(endpoint);
  }
  std::string payload(size, '\x5a');
  std::vector<int> sent(clients, 0), acked(clients, 0);
  int done = 0;
  while (done < clients) {
    done = 0;
    for (int c = 0; c < clients; ++c) {
      zmq::message_t ack;
      while (sockets[c].recv(ack, zmq::recv_flags::dontwait)) ++acked[c];
      while (sent[c] < per_client && sent[c] - acked[c] < window) {
        sockets[c].send(zmq::buffer(payload), zmq::send_flags::none);
        ++sent[c];
      }
      if (acked[c] == per_client) ++done;
    }
    if (done < clients) {
      std::vector<zmq::pollitem_t> items;
      for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
    }
  }
  return 0;
}

// One run: the collector's side in this process (its CPU, all threads, is
// the figure: libzmq encrypts and decrypts on its I/O thread), the agents
// in a child.
Figures run(bool curve_on, int clients, int per_client, size_t size, int window) {
  curve::KeyFile server_key;
  if (curve_on) {
    auto made = curve::generate("bench-collector", "collector");
    if (!made) throw std::runtime_error(made.error().message);
    server_key = *made;
  }
  std::string endpoint = "tcp://127.0.0.1:" + std::to_string(free_tcp_port());
  pid_t child = fork();
  if (child < 0) throw std::runtime_error("fork failed");
  if (child == 0) _exit(send_all(endpoint, curve_on ? &server_key : nullptr, clients, per_client, size, window));

  uint64_t total = static_cast<uint64_t>(clients) * static_cast<uint64_t>(per_client);
  uint64_t received = 0, t0 = 0, cpu0 = 0, wall = 0, cpu = 0;
  {
    zmq::context_t context(1);
    zmq::socket_t server(context, zmq::socket_type::router);
    server.set(zmq::sockopt::linger, 0);
    if (curve_on) {
      server.set(zmq::sockopt::curve_server, 1);
      server.set(zmq::sockopt::curve_secretkey, server_key.secret_key);
    }
    server.set(zmq::sockopt::rcvtimeo, 30000);
    server.bind(endpoint);
    std::string ack_bytes(24, '\x01');  // about an ack's packed size
    while (received < total) {
      zmq::message_t id, body;
      if (!server.recv(id, zmq::recv_flags::none)) break;  // 30 s of silence: the agents died
      (void)server.recv(body, zmq::recv_flags::none);
      if (received == 0) {  // from the first message: the handshakes are not the steady state
        t0 = wall_ns();
        cpu0 = process_cpu_ns();
      }
      server.send(id, zmq::send_flags::sndmore);
      server.send(zmq::buffer(ack_bytes), zmq::send_flags::none);
      ++received;
    }
    wall = wall_ns() - t0;
    cpu = process_cpu_ns() - cpu0;
  }
  int status = 0;
  waitpid(child, &status, 0);
  if (received < total || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("the sending process failed (" + std::to_string(received) + " of " +
                             std::to_string(total) + " messages received)");
  Figures r;
  r.messages_per_s = static_cast<double>(received - 1) / (static_cast<double>(wall) / 1e9);
  r.server_cpu_us_per_message = static_cast<double>(cpu) / 1e3 / static_cast<double>(received - 1);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int clients = 100, messages = 2000, window = 32, runs = 3;
  std::vector<size_t> sizes = {512, 16384};
  po::options_description desc("rankscope-bench-curve: CurveZMQ against plaintext on the collector's agent socket");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help")
    ("clients", po::value(&clients)->default_value(clients), "agent connections")
    ("messages", po::value(&messages)->default_value(messages), "messages per connection and run")
    ("window", po::value(&window)->default_value(window), "unacknowledged messages per connection at most")
    ("size", po::value(&sizes)->multitoken(), "message sizes in bytes (default: 512 16384)")
    ("runs", po::value(&runs)->default_value(runs), "runs of each case (the median is printed)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "rankscope-bench-curve: " << e.what() << "\n" << desc;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (!curve::available()) {
    std::cerr << "rankscope-bench-curve: this libzmq has no CurveZMQ\n";
    return 1;
  }
  if (clients < 1 || messages < 2 || window < 1 || runs < 1) {
    std::cerr << "rankscope-bench-curve: --clients, --window, --runs must be at least 1 and --messages at least 2\n";
    return 2;
  }
  std::printf("%d connections x %d messages each, at most %d unacknowledged per connection; median of %d runs\n\n",
              clients, messages, window, runs);
  std::printf("| message | plaintext msg/s | CurveZMQ msg/s | plaintext CPU us/msg | CurveZMQ CPU us/msg | CPU ratio |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (size_t size : sizes) {
    std::vector<Figures> plain, curve_runs;
    try {
      for (int i = 0; i < runs; ++i) {  // interleaved: both see the same machine
        plain.push_back(run(false, clients, messages, size, window));
        curve_runs.push_back(run(true, clients, messages, size, window));
      }
    } catch (const std::exception& e) {
      std::cerr << "rankscope-bench-curve: " << e.what() << "\n";
      return 1;
    }
    auto median = [](std::vector<Figures> v, double Figures::*field) {
      std::sort(v.begin(), v.end(), [&](const Figures& a, const Figures& b) { return a.*field < b.*field; });
      return v[v.size() / 2].*field;
    };
    double p_rate = median(plain, &Figures::messages_per_s), c_rate = median(curve_runs, &Figures::messages_per_s);
    double p_cpu = median(plain, &Figures::server_cpu_us_per_message);
    double c_cpu = median(curve_runs, &Figures::server_cpu_us_per_message);
    std::printf("| %zu B | %.0f | %.0f | %.2f | %.2f | %.2fx |\n", size, p_rate, c_rate, p_cpu, c_cpu, c_cpu / p_cpu);
  }
  return 0;
}
